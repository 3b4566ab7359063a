"""What the report shows: the overview's figures (the exposed fraction says nothing at
N = 1, MFU's axis starts at 0, and legends of many series stay off the plotted lines),
and beyond scaling, memory per rank by kind against N per strategy, loss against step
beside the 1-rank run, and each collective's achieved bandwidth beside `bench comm`'s."""
import re

import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.report import plots
from scalestudy_analysis.report.bandwidth import bandwidth_table, load_benches
from scalestudy_analysis.report.cli import main
from scalestudy_analysis.results.load import load_results
from scalestudy_analysis.report.loss import loss_figure
from scalestudy_analysis.report.memory import memory_markdown, memory_table
from scalestudy_analysis.results.metrics import group_series
from synth import MEMORY_KINDS, base_config, write_run
from test_bench import write_bench

MIB = 1 << 20
STEP = 0.1
PAYLOAD = 4 * MIB


@pytest.fixture
def drawn(monkeypatch):
    """{file name: figure} of every figure saved, inspected just before it is written."""
    saved = {}
    original = plots.save_figure

    def keep(figure, out_dir, name):
        figure.canvas.draw()
        saved[name] = {"ylim": figure.axes[0].get_ylim(),
                       "axes": [axis.get_window_extent() for axis in figure.axes],
                       "legend": figure.axes[0].get_legend().get_window_extent()
                       if figure.axes[0].get_legend() else None}
        return original(figure, out_dir, name)

    monkeypatch.setattr(plots, "save_figure", keep)
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


def memory_of(strategy, n):
    """Bytes by kind on each rank: zero2 shards gradients and optimizer state."""
    shard = n if strategy == "zero2" else 1
    return [100 * MIB, 50 * MIB // shard, 200 * MIB // shard, 400 * MIB // n, 10 * MIB, 5 * MIB]


def write_strategies(root, loss=None):
    for strategy in ("ddp", "zero2"):
        for n in (1, 2, 4):
            memory = np.tile(memory_of(strategy, n), (n, 1))
            memory[-1, 3] += MIB  # the last rank holds one MiB more activations
            write_run(root / f"{strategy}{n}.h5", world_size=n, step_times=STEP,
                      config=base_config(strategy=strategy), memory_bytes=memory,
                      loss=None if loss is None else loss(strategy, n))


def series_by_strategy(root):
    runs, _, _ = load_results(root)
    series_list, _ = group_series(runs)
    return series_list, {s.strategy_label: s for s in series_list}


def test_memory_per_rank_is_the_fullest_ranks_by_kind_and_adds_up(tmp_path):
    write_strategies(tmp_path)
    _, series = series_by_strategy(tmp_path)
    for strategy in ("ddp", "zero2"):
        frame = memory_table(series[strategy]).set_index("N")
        for n in (1, 2, 4):
            expected = memory_of(strategy, n)
            expected[3] += MIB
            assert frame.loc[n, list(MEMORY_KINDS)].tolist() == expected, (strategy, n)
            assert frame.loc[n, "total"] == sum(expected)
            assert frame.loc[n, "peak"] == 1 << 30
    zero2, ddp = memory_table(series["zero2"]), memory_table(series["ddp"])
    assert (zero2["optimizer"].iloc[1:].to_numpy() < ddp["optimizer"].iloc[1:].to_numpy()).all()
    # Version 5 files carry no estimate: the column is there, empty, and the markdown leaves it out.
    assert zero2["estimate"].isna().all()
    assert "estimate" not in memory_markdown(zero2)


def test_memory_table_holds_the_preflights_estimate_beside_the_measured_bytes(tmp_path):
    for n, estimate in ((1, 900 * MIB), (2, 700 * MIB)):
        write_run(tmp_path / f"v6_{n}.h5", world_size=n, step_times=STEP, config=base_config(strategy="zero2"),
                  memory_bytes=memory_of("zero2", n), schema_version=6, memory_estimate_bytes=estimate)
    write_run(tmp_path / "v5_2.h5", world_size=2, step_times=STEP, config=base_config(strategy="zero2"),
              memory_bytes=memory_of("zero2", 2), schema_version=5)
    _, series = series_by_strategy(tmp_path)
    frame = memory_table(series["zero2"]).set_index("N")
    # N = 2: the version 5 run counts in the measured bytes and not in the estimate.
    assert frame.loc[1, "estimate"] == 900 * MIB and frame.loc[2, "estimate"] == 700 * MIB
    markdown = memory_markdown(frame.reset_index())  # in GiB: the synthetic peak is 1 GiB
    assert "estimate (GiB)" in markdown and "| 0.6836 |" in markdown


def test_loss_curves_are_measured_against_the_1_rank_run(tmp_path):
    # N = 4 of ddp departs by 5 % at its last step; zero2 has no 1-rank run of its own and
    # takes ddp's, which trains the same model on the same data.
    def loss(strategy, n):
        values = np.linspace(5.0, 4.0, 6)
        if strategy == "ddp" and n == 4:
            values[-1] *= 1.05
        return values
    write_strategies(tmp_path, loss=loss)
    (tmp_path / "zero21.h5").unlink()
    series_list, series = series_by_strategy(tmp_path)
    figure, departures = loss_figure(series["ddp"], series_list, tmp_path)
    assert departures == pytest.approx({1: 0.0, 2: 0.0, 4: 0.05}, abs=1e-12)
    figure, departures = loss_figure(series["zero2"], series_list, tmp_path)
    assert departures == pytest.approx({2: 0.0, 4: 0.0}, abs=1e-12)
    assert (tmp_path / figure.file).stat().st_size > 0 and figure.note == ""


def test_bandwidth_is_payload_over_the_comm_streams_time_with_the_bus_factor(tmp_path):
    # The default layout runs one allreduce per step and rank over 0.85–0.95 of the step.
    for n in (1, 2, 4):
        steps = np.full((6, n), STEP)
        rows = [(s, r, 0, 3, 0.85 * STEP, 0.95 * STEP, PAYLOAD) for s in range(6) for r in range(n)]
        write_run(tmp_path / "runs" / f"n{n}.h5", world_size=n, step_times=steps, collectives=rows)
    # A bench file of 4 ranks with sizes around the payload: 4 MiB at 80 GB/s busbw is nearest.
    sizes = [MIB, 4 * MIB + 4096, 64 * MIB]
    busbw = [40.0, 80.0, 120.0]
    factor = 2 * 3 / 4
    times = [size / (bw / factor) / 1e9 for size, bw in zip(sizes, busbw)]
    write_bench(tmp_path / "comm4.h5", "comm", {
        "collective": ["allreduce"] * 3, "bytes": sizes, "elems": [s // 4 for s in sizes],
        "time_median_s": times, "algbw_gb_per_s": [bw / factor for bw in busbw],
        "bus_factor": [factor] * 3, "busbw_gb_per_s": busbw, "wrong_elems": [0] * 3}, world_size=4)
    benches, problems = load_benches([tmp_path / "comm4.h5"])
    assert problems == [] and len(benches) == 1
    runs, _, _ = load_results(tmp_path / "runs")
    (series,), _ = group_series(runs)
    frame = bandwidth_table(series, benches).set_index("N")
    assert list(frame.index) == [2, 4]          # one rank has no peer
    algbw = PAYLOAD / (0.1 * STEP) / 1e9
    assert frame.loc[2, "algbw_gb_per_s"] == pytest.approx(algbw, rel=1e-9)
    assert frame.loc[2, "busbw_gb_per_s"] == pytest.approx(algbw * 1.0, rel=1e-9)
    assert frame.loc[4, "busbw_gb_per_s"] == pytest.approx(algbw * 1.5, rel=1e-9)
    assert frame.loc[4, "records"] == 5 * 4      # measured steps × ranks
    assert frame.loc[4, "bench_busbw_gb_per_s"] == pytest.approx(80.0)
    assert frame.loc[4, "bench_bytes"] == 4 * MIB + 4096
    assert np.isnan(frame.loc[2, "bench_busbw_gb_per_s"])  # no 2-rank bench file
    # A node-local point of a 4-rank file, at the payload's very size, is not training's
    # match: training's collectives span every rank.
    from test_bench import comm_scope_columns
    write_bench(tmp_path / "scoped4.h5", "comm", comm_scope_columns(
        [("world", 4, 1, "allreduce", 4 * MIB + 4096, times[1]),
         ("intra_node", 2, 2, "allreduce", PAYLOAD, 1e-6)]), world_size=4, schema_version=8)
    scoped, _ = load_benches([tmp_path / "scoped4.h5"])
    frame = bandwidth_table(series, scoped).set_index("N")
    assert frame.loc[4, "bench_busbw_gb_per_s"] == pytest.approx(80.0)
    out = tmp_path / "out"
    assert main([str(tmp_path / "runs"), "-o", str(out), "--bench", str(tmp_path / "comm4.h5")]) == 0
    report = (out / "report.md").read_text()
    assert "| 4 | allreduce | 4 MiB | 20 |" in report and "80 at 4 MiB" in report
    assert (out / f"bandwidth_{series.slug}.png").stat().st_size > 0


def test_the_report_has_memory_loss_and_bandwidth_for_every_series(tmp_path):
    write_strategies(tmp_path / "r")
    out = tmp_path / "out"
    assert main([str(tmp_path / "r"), "-o", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert report.count("#### Memory per rank") == 2 and report.count("#### Loss") == 2
    assert report.count("#### Collectives' bandwidth") == 2
    assert "## Memory per rank by strategy" in report and (out / "memory_01.png").exists()
    for name in ("loss_s01-tiny-ddp-strong.png", "bandwidth_s02-tiny-zero2-strong.png"):
        assert (out / name).stat().st_size > 0
    assert pd.read_csv(out / "runs.csv").shape[0] == 6
