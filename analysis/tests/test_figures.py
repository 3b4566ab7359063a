"""The overview's figures: the exposed fraction says nothing at N = 1, MFU's axis starts
at 0, and legends of many series stay off the plotted lines."""
import re

import pytest

from scalestudy_analysis import plots
from scalestudy_analysis.cli import main
from scalestudy_analysis.load import load_results
from scalestudy_analysis.metrics import group_series
from synth import base_config, write_run


@pytest.fixture
def drawn(monkeypatch):
    """{file name: figure} of every figure saved, inspected just before it is written."""
    saved = {}
    original = plots._save

    def keep(figure, out_dir, name):
        figure.canvas.draw()
        saved[name] = {"ylim": figure.axes[0].get_ylim(),
                       "axes": [axis.get_window_extent() for axis in figure.axes],
                       "legend": figure.axes[0].get_legend().get_window_extent()
                       if figure.axes[0].get_legend() else None}
        return original(figure, out_dir, name)

    monkeypatch.setattr(plots, "_save", keep)
    return saved


def test_exposed_fraction_is_a_dash_at_one_rank_and_mfu_starts_at_0(tmp_path, drawn):
    for n in (1, 2):
        write_run(tmp_path / "r" / f"n{n}.h5", world_size=n, step_times=0.1, backend="cuda",
                  peak=100.0, peak_source="datasheet: test", flops_per_step=2e13)
    assert main([str(tmp_path / "r"), "-o", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    # N, nodes×ranks per node, link, repeats, steps, step time, tokens/s, speedup,
    # efficiency, Karp–Flatt, exposed.
    rows = dict(re.findall(r"^\| (\d) \| 1×\d \| [^|]+ \| \d \| \d \| [^|]+ \| [^|]+ \| [^|]+ \| [^|]+ \| [^|]+ \| "
                           r"([^|]+) \|", report, re.MULTILINE))
    assert rows == {"1": "—", "2": "100.0 %"}
    assert drawn["mfu.png"]["ylim"][0] == 0.0


def test_legends_of_sixteen_entries_stay_off_the_communication_plot(tmp_path, drawn):
    for strategy in ("ddp", "zero2"):
        for overlap in ("off", "on"):
            for seq in (64, 128):
                for n in (1, 2):
                    write_run(tmp_path / "r" / f"{strategy}{overlap}{seq}n{n}.h5", world_size=n,
                              step_times=0.1, config=base_config(strategy=strategy,
                                                                 overlap=overlap, seq=seq))
    runs, _, _ = load_results(tmp_path / "r")
    series_list, _ = group_series(runs)
    assert len(series_list) == 8
    plots.overview_figures(series_list, tmp_path)
    for name in ("comm_fraction.png", "tokens_per_s.png", "strong_efficiency.png"):
        legend, (axes, *_) = drawn[name]["legend"], drawn[name]["axes"]
        assert legend is not None and not legend.overlaps(axes), name
