"""Scaling metrics against closed forms, and with --baseline SERIES every series'
efficiency against one series' N0."""
import math

import numpy as np
import pytest

from scalestudy_analysis.results.baseline import BaselineError, add_common_efficiency
from scalestudy_analysis.report.cli import main
from scalestudy_analysis.results.load import load_results
from scalestudy_analysis.results.metrics import group_series
from synth import base_config, write_run

A, B = 0.1, 0.9
SIZES = (1, 2, 4)   # the world sizes of the --baseline sets


def series_from(tmp_path):
    runs, _, problems = load_results(tmp_path)
    series_list, series_problems = group_series(runs)
    return series_list, problems + series_problems


@pytest.mark.parametrize("sizes", [(1, 2, 4, 8), (2, 4, 8, 16), (1, 3, 6)])
def test_strong_scaling_amdahl_closed_forms(tmp_path, sizes):
    for n in sizes:
        for repeat in range(2):
            write_run(tmp_path / f"n{n}_r{repeat}.h5", world_size=n, step_times=A + B / n,
                      config=base_config(repeat=repeat, global_batch=48))
    (series,), problems = series_from(tmp_path)
    assert problems == []
    table = series.table
    n0 = sizes[0]
    assert series.baseline_n == n0
    n = table["N"].to_numpy(dtype=float)
    speedup = (A + B / n0) / (A + B / n)
    np.testing.assert_allclose(table["speedup"], speedup, rtol=1e-9)
    np.testing.assert_allclose(table["efficiency"], speedup * n0 / n, rtol=1e-9)
    # T = a + b/N makes the Karp-Flatt fraction constant: a / T(N0).
    np.testing.assert_allclose(table["karp_flatt"][1:], A / (A + B / n0), rtol=1e-9)
    assert math.isnan(table["karp_flatt"][0])
    assert table["repeats"].tolist() == [2] * len(sizes)


def test_weak_scaling_efficiency(tmp_path):
    def step_time(n):
        return 0.2 + 0.01 * n
    for n in (1, 2, 4, 8):
        write_run(tmp_path / f"w{n}.h5", world_size=n, step_times=step_time(n),
                  config=base_config(scaling="weak", batch_per_rank=4))
    (series,), _ = series_from(tmp_path)
    assert series.scaling == "weak"
    expected = [step_time(1) / step_time(n) for n in (1, 2, 4, 8)]
    np.testing.assert_allclose(series.table["efficiency"], expected, rtol=1e-9)
    tokens_per_rank = 4 * 64
    np.testing.assert_allclose(series.table["tokens_per_s"],
                               [tokens_per_rank * n / step_time(n) for n in (1, 2, 4, 8)],
                               rtol=1e-9)


def test_spread_pools_all_measured_steps_of_all_repeats(tmp_path):
    # Warm-up step 0 (value 100) must be ignored; measured steps pool to 1..8.
    write_run(tmp_path / "r0.h5", world_size=2, steps=5, step_times=[100, 1, 2, 3, 4],
              config=base_config(repeat=0))
    write_run(tmp_path / "r1.h5", world_size=2, steps=5, step_times=[100, 5, 6, 7, 8],
              config=base_config(repeat=1))
    (series,), _ = series_from(tmp_path)
    point = series.table.iloc[0]
    assert point["steps"] == 8
    assert (point["step_time_q1_s"], point["step_time_median_s"], point["step_time_q3_s"]) == \
        pytest.approx((2.75, 4.5, 6.25), rel=1e-12)


def test_breakdown_parts_sum_to_the_step_and_mfu(tmp_path):
    write_run(tmp_path / "a.h5", world_size=4, step_times=0.5, flops_per_step=4e14,
              peak=100.0, peak_source="datasheet: test", backend="cuda")
    (series,), _ = series_from(tmp_path)
    point = series.table.iloc[0]
    parts = sum(point[c] for c in ("compute_mean_s", "exposed_comm_mean_s", "optimizer_mean_s",
                                   "data_mean_s", "other_mean_s"))
    assert parts == pytest.approx(0.5, rel=1e-12)
    assert point["compute_mean_s"] == pytest.approx(0.4, rel=1e-12)
    assert point["exposed_comm_mean_s"] == pytest.approx(0.05, rel=1e-12)
    assert point["data_mean_s"] == pytest.approx(0.025, rel=1e-12)
    assert point["exposed_comm_fraction"] == pytest.approx(1.0, rel=1e-12)
    assert point["tflops_per_gpu"] == pytest.approx(4e14 / 0.5 / 4 / 1e12, rel=1e-12)
    assert point["mfu"] == pytest.approx(2.0, rel=1e-12)


def test_compute_spread_is_the_slowest_ranks_compute_over_the_fastest(tmp_path):
    # Rank 1's steps, and so its phases, are 2 % longer than rank 0's in every step.
    lengths = np.tile([[0.5, 0.51]], (6, 1))
    write_run(tmp_path / "n2.h5", world_size=2, step_times=lengths)
    write_run(tmp_path / "n1.h5", world_size=1, step_times=0.5)
    (series,), _ = series_from(tmp_path)
    spread = series.table.set_index("N")["compute_spread"]
    assert spread[2] == pytest.approx(0.02, rel=1e-9)
    assert spread[1] == 0.0


def test_strategies_form_separate_series(tmp_path):
    for strategy in ("ddp", "zero2"):
        for n in (1, 2):
            write_run(tmp_path / f"{strategy}{n}.h5", world_size=n, step_times=0.1,
                      config=base_config(strategy=strategy))
    series_list, problems = series_from(tmp_path)
    assert [s.fields["strategy"] for s in series_list] == ["ddp", "zero2"]
    assert problems == []


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
