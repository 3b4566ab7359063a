"""--baseline SERIES: every series' efficiency against one series' N0, on closed forms."""
import numpy as np
import pytest

from scalestudy_analysis.baseline import BaselineError, add_common_efficiency
from scalestudy_analysis.cli import main
from scalestudy_analysis.load import load_results
from scalestudy_analysis.metrics import group_series
from synth import base_config, write_run

SIZES = (1, 2, 4)


def ddp_weak(n):
    return 0.2 + 0.01 * n


def zero2_weak(n):
    return 0.215 + 0.004 * n


def write_weak(root):
    for n in SIZES:
        write_run(root / f"ddp{n}.h5", world_size=n, step_times=ddp_weak(n),
                  config=base_config(scaling="weak", batch_per_rank=4))
        write_run(root / f"zero2{n}.h5", world_size=n, step_times=zero2_weak(n),
                  config=base_config(scaling="weak", batch_per_rank=4, strategy="zero2",
                                     overlap="on"))


def series_with(root, spec):
    runs, _, _ = load_results(root)
    series_list, _ = group_series(runs)
    add_common_efficiency(series_list, spec)
    return {s.strategy_label: s for s in series_list}


@pytest.mark.parametrize("spec", ["ddp", "1", "strategy=ddp,overlap=off"])
def test_weak_efficiency_against_ddps_smallest_run(tmp_path, spec):
    write_weak(tmp_path)
    series = series_with(tmp_path, spec)
    n = np.array(SIZES, dtype=float)
    # Weak: tokens/s per rank at N over ddp's at N = 1, i.e. T_ddp(1) / T(N).
    np.testing.assert_allclose(series["zero2+overlap"].table["efficiency_common"],
                               ddp_weak(1) / zero2_weak(n), rtol=1e-9)
    np.testing.assert_allclose(series["ddp"].table["efficiency_common"],
                               series["ddp"].table["efficiency"], rtol=1e-12)
    # Its own efficiency stays what it was: against its own N = 1.
    np.testing.assert_allclose(series["zero2+overlap"].table["efficiency"],
                               zero2_weak(1) / zero2_weak(n), rtol=1e-9)
    assert (series["zero2+overlap"].table["baseline_series"] == series["ddp"].index).all()


def test_strong_efficiency_against_a_baseline_with_another_n0(tmp_path):
    # ddp from N = 2, zero2 from N = 1: zero2's efficiency against ddp's N0 = 2 is
    # T_ddp(2) · 2 / (T_zero2(N) · N); series of another model keep none.
    for n in (2, 4):
        write_run(tmp_path / f"ddp{n}.h5", world_size=n, step_times=0.1 + 0.8 / n)
    for n in (1, 2, 4):
        write_run(tmp_path / f"zero2{n}.h5", world_size=n, step_times=0.12 + 0.8 / n,
                  config=base_config(strategy="zero2"))
        write_run(tmp_path / f"other{n}.h5", world_size=n, step_times=0.1,
                  config=base_config(strategy="zero2", model="tiny-other"))
    runs, _, _ = load_results(tmp_path)
    series_list, _ = group_series(runs)
    add_common_efficiency(series_list, "ddp")
    by_model = {(s.fields["model"], s.strategy_label): s for s in series_list}
    zero2 = by_model[("tiny", "zero2")].table
    n = zero2["N"].to_numpy(dtype=float)
    np.testing.assert_allclose(zero2["efficiency_common"], (0.1 + 0.8 / 2) * 2 / ((0.12 + 0.8 / n) * n),
                               rtol=1e-9)
    assert zero2["baseline_n"].tolist() == [2, 2, 2]
    assert np.isnan(by_model[("tiny-other", "zero2")].table["efficiency_common"]).all()


def test_the_report_shows_the_common_efficiency_and_its_figure(tmp_path):
    write_weak(tmp_path / "r")
    assert main([str(tmp_path / "r"), "-o", str(tmp_path / "out"), "--baseline", "ddp"]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "efficiency vs baseline [IQR]" in report
    assert "Efficiency vs baseline: against series 1 at N0 = 1" in report
    assert (tmp_path / "out" / "weak_efficiency_common.png").stat().st_size > 0
    expected = ddp_weak(1) / zero2_weak(4)
    assert f"| {expected:.4g} [" in report


def test_a_baseline_that_matches_nothing_or_too_much_exits_2(tmp_path, capsys):
    write_weak(tmp_path)
    assert main([str(tmp_path), "-o", str(tmp_path / "out"), "--baseline", "zero3"]) == 2
    assert "matches no series" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    write_run(tmp_path / "ddp1b.h5", world_size=1, step_times=0.3,
              config=base_config(scaling="weak", batch_per_rank=4, bucket_mb="1"))
    with pytest.raises(BaselineError, match="name one by its number"):
        series_with(tmp_path, "ddp")
