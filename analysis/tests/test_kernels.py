"""Traced steps and the kernel profile (/kernel_trace, schema v2) against known answers.

Tolerances: record durations are whole nanoseconds, so the sums behind every value are
exact in float64 and only the final divisions round; values are compared at a relative
1e-12 (RTOL). The summary check between file and recomputation is the loader's own,
relative 1e-6 as the schema states. Equalities without a tolerance hold exactly by
construction (zeros, counts, values copied unchanged)."""
import math
import re

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.report.cli import main
from scalestudy_analysis.bench.kernels import (category_times, imbalance, series_profile,
                                         top_kernels)
from scalestudy_analysis.results.load import load_results, read_run
from scalestudy_analysis.results.metrics import group_series
from synth import base_config, changed_file, trace_records, write_run

RTOL = 1e-12
MS = 1_000_000  # ns
TRACED = (3, 4)
STEPS = 8       # step 0 is warm-up, steps 3 and 4 are traced: 5 measured steps


def step_kernels(comm_ms):
    """One traced step of one rank: 6 ms gemm in two calls, 2 ms attention, 1 ms norm,
    0.5 ms memcpy and comm_ms of NCCL (none when 0)."""
    kernels = [("ampere_sgemm_128x64_nn", "gemm", 3 * MS),
               ("flash_attention_forward", "attention", 2 * MS),
               ("ampere_sgemm_128x64_nn", "gemm", 3 * MS),
               ("layernorm_forward", "norm_elementwise", 1 * MS),
               ("memcpy HtoD", "memory", MS // 2)]
    if comm_ms:
        kernels.append(("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication",
                        int(comm_ms * MS)))
    return kernels


def expected_ms(comm_ms):
    return {"gemm": 6.0, "attention": 2.0, "norm_elementwise": 1.0, "optimizer": 0.0,
            "communication": float(comm_ms), "memory": 0.5, "other": 0.0}


def write_profiled(path, comm_ms=(2, 4), step_times=0.1, **options):
    """A run whose rank r spends comm_ms[r] ms of NCCL kernels per traced step; rank 1
    with twice rank 0's communication by default."""
    ranks = [trace_records(TRACED, step_kernels(comm)) for comm in comm_ms]
    return write_run(path, world_size=len(comm_ms), steps=STEPS, step_times=step_times,
                     traced_steps=TRACED, kernel_trace=ranks, **options)


def test_category_time_per_traced_step_and_fractions(tmp_path):
    run = read_run(write_profiled(tmp_path / "run.h5"))
    assert run.usable and run.problems == []
    trace = run.kernel_trace
    assert trace.traced_steps == 2 and [r.device for r in trace.ranks] == [
        "Synthetic GPU 0", "Synthetic GPU 1"]
    times = category_times(trace)
    for rank, comm in ((0, 2), (1, 4)):
        expected = expected_ms(comm)
        total = sum(expected.values())          # 11.5 ms on rank 0, 13.5 ms on rank 1
        for category, ms in expected.items():
            assert times.ms_per_step.loc[rank, category] == pytest.approx(ms, rel=RTOL)
            assert times.fraction.loc[rank, category] == pytest.approx(ms / total, rel=RTOL)
    np.testing.assert_allclose(times.fraction.sum(axis=1), [1.0, 1.0], rtol=RTOL)


def test_imbalance_is_max_over_mean_of_the_ranks(tmp_path):
    run = read_run(write_profiled(tmp_path / "run.h5"))
    ratio = imbalance(category_times(run.kernel_trace).ms_per_step)
    assert ratio["communication"] == pytest.approx(4 / 3, rel=RTOL)   # 4 / mean(2, 4)
    assert ratio["gemm"] == pytest.approx(1.0, rel=RTOL)
    assert math.isnan(ratio["optimizer"]) and math.isnan(ratio["other"])


def test_top_kernels_order_cut_calls_mean_and_share(tmp_path):
    us = 1000
    kernels = [(f"k{i}", "other", 10 * i * us) for i in range(1, 9)]   # 10 .. 80 us
    kernels += [("shared", "attention", 300 * us), ("zz_tie", "norm_elementwise", 500 * us),
                ("gemm_a", "gemm", 900 * us), ("shared", "gemm", 700 * us),
                ("aa_tie", "norm_elementwise", 500 * us), ("gemm_a", "gemm", 900 * us)]
    path = write_run(tmp_path / "run.h5", world_size=1, steps=STEPS, traced_steps=(5,),
                     kernel_trace=[trace_records((5,), kernels)])
    run = read_run(path)
    assert run.problems == []
    top = top_kernels(run.kernel_trace.ranks[0])
    # A name under two categories is two rows; equal totals go by name.
    assert list(zip(top["name"], top["category"])) == [
        ("gemm_a", "gemm"), ("shared", "gemm"), ("aa_tie", "norm_elementwise"),
        ("zz_tie", "norm_elementwise"), ("shared", "attention"), ("k8", "other"),
        ("k7", "other"), ("k6", "other"), ("k5", "other"), ("k4", "other")]
    total_ms = 1.8 + 0.7 + 0.3 + 0.5 + 0.5 + 0.36
    first = top.iloc[0]
    assert first["calls"] == 2
    assert first["total_ms"] == pytest.approx(1.8, rel=RTOL)
    assert first["mean_us"] == pytest.approx(900.0, rel=RTOL)
    assert first["share"] == pytest.approx(1.8 / total_ms, rel=RTOL)
    assert top.iloc[-1]["share"] == pytest.approx(0.04 / total_ms, rel=RTOL)


def test_series_profile_against_n_with_a_one_and_a_two_rank_run(tmp_path):
    write_profiled(tmp_path / "n1.h5", comm_ms=(0,))
    write_profiled(tmp_path / "n2.h5", comm_ms=(2, 4))
    runs, _, problems = load_results(tmp_path)
    (series,), series_problems = group_series(runs)
    assert problems == [] and series_problems == []
    profile = series_profile(series.runs)
    assert profile.sizes == [1, 2]
    share = profile.comm_share
    assert share[1] == 0.0
    assert share[2] == pytest.approx((2 / 11.5 + 4 / 13.5) / 2, rel=RTOL)
    assert profile.ms_per_step.loc[2, "communication"] == pytest.approx(3.0, rel=RTOL)
    assert profile.ms_per_step.loc[1, "gemm"] == pytest.approx(6.0, rel=RTOL)
    assert profile.imbalance.loc[2, "communication"] == pytest.approx(4 / 3, rel=RTOL)
    assert profile.imbalance.loc[1, "gemm"] == pytest.approx(1.0, rel=RTOL)
    assert math.isnan(profile.imbalance.loc[1, "communication"])   # no rank ran any
    np.testing.assert_allclose(profile.fraction.sum(axis=1), [1.0, 1.0], rtol=RTOL)
    assert profile.active_categories() == ["gemm", "attention", "norm_elementwise",
                                           "communication", "memory"]


def test_repeats_at_one_n_are_pooled_over_their_ranks(tmp_path):
    write_profiled(tmp_path / "r0.h5", comm_ms=(2, 4), config=base_config(repeat=0))
    write_profiled(tmp_path / "r1.h5", comm_ms=(6, 6), config=base_config(repeat=1))
    runs, _, _ = load_results(tmp_path)
    (series,), _ = group_series(runs)
    profile = series_profile(series.runs)
    assert profile.runs[2] == 2 and profile.traced_steps[2] == 4
    assert profile.ms_per_step.loc[2, "communication"] == pytest.approx(4.5, rel=RTOL)
    # Imbalance is per run (4/3 and 1), then averaged: ranks of different runs never mix.
    assert profile.imbalance.loc[2, "communication"] == pytest.approx((4 / 3 + 1) / 2, rel=RTOL)


def test_traced_steps_are_excluded_from_the_summary(tmp_path):
    # Warm-up 0.5 s, traced steps 3 and 4 made 90 times slower than any measured one.
    times = [0.5, 0.10, 0.12, 9.0, 9.0, 0.11, 0.13, 0.10]
    slow = read_run(write_profiled(tmp_path / "slow.h5", step_times=times))
    fast = read_run(write_profiled(tmp_path / "fast.h5",
                                   step_times=[t if t != 9.0 else 0.1 for t in times]))
    for run in (slow, fast):
        # problems == []: the stored reference summary, which skips traced steps too,
        # agrees with the recomputation within the schema's 1e-6.
        assert run.usable and run.problems == []
        assert run.summary["steps_measured"] == 5
        assert run.summary["step_time_median_s"] == pytest.approx(0.11, rel=RTOL)
    assert slow.summary["step_time_q3_s"] == fast.summary["step_time_q3_s"]
    assert slow.measured.tolist() == [False, True, True, False, False, True, True, True]
    assert slow.kernel_trace.attribute("tracing_overhead") == pytest.approx(9.0 / 0.11 - 1,
                                                                           rel=RTOL)
    (series,), _ = group_series([slow])
    assert series.table.iloc[0]["steps"] == 5
    assert series.table.iloc[0]["step_time_median_s"] == pytest.approx(0.11, rel=RTOL)


def test_a_summary_that_counted_traced_steps_is_a_mismatch(tmp_path):
    times = [0.5, 0.10, 0.12, 9.0, 9.0, 0.11, 0.13, 0.10]
    path = write_profiled(tmp_path / "run.h5", step_times=times)
    with h5py.File(path, "r+") as handle:
        handle["summary"].attrs["steps_measured"] = np.int64(7)
        handle["summary"].attrs["step_time_median_s"] = float(np.median(times[1:]))
    run = read_run(path)
    assert not run.usable and [p.kind for p in run.problems] == ["summary mismatch"]
    assert "steps_measured" in run.problems[0].message and run.problems[0].excluded


def test_version_1_files_still_read(tmp_path):
    path = write_run(tmp_path / "v1.h5", world_size=2, steps=6, step_times=0.1,
                     schema_version=1)
    with h5py.File(path, "r") as handle:
        assert handle.attrs["schema_version"] == 1 and "steps/traced" not in handle
    run = read_run(path)
    assert run.usable and run.problems == []
    assert run.traced.tolist() == [0] * 6 and run.kernel_trace is None
    assert run.summary["steps_measured"] == 5


@pytest.mark.parametrize("version", [2, 3, 4])
def test_version_2_to_4_file_without_traced_is_read_and_named(tmp_path, version):
    path = write_run(tmp_path / "run.h5", world_size=1, step_times=0.1, schema_version=version)
    with h5py.File(path, "r+") as handle:
        del handle["steps/traced"]
    run = read_run(path)
    assert run.usable and run.summary["steps_measured"] == 5
    assert [(p.kind, p.excluded) for p in run.problems] == [("missing field", False)]
    assert "/steps/traced" in run.problems[0].message
    assert f"schema version {version} file" in run.problems[0].message


def _drop(name):
    def change(handle):
        del handle[name]
    return change


def _shorten(name):
    def change(handle):
        values = handle[name][()]
        del handle[name]
        handle.create_dataset(name, data=values[:-1])
    return change


def _set_category(handle):
    values = handle["kernel_trace/rank_1/category"][()]
    values[2] = 7       # category_names has 7 entries, 0..6
    handle["kernel_trace/rank_1/category"][...] = values


def _rename_categories(handle):
    handle["kernel_trace"].attrs["category_names"] = np.array(["gemm", "rest"], dtype=object)


MALFORMED = {
    "missing dataset": (_drop("kernel_trace/rank_1/category"),
                        "missing /kernel_trace/rank_1/category"),
    "missing rank": (_drop("kernel_trace/rank_1"), "missing /kernel_trace/rank_1"),
    "length mismatch": (_shorten("kernel_trace/rank_0/end_ns"),
                        "/kernel_trace/rank_0/end_ns has shape [11], expected [12]"),
    "category out of range": (_set_category,
                              "/kernel_trace/rank_1/category holds 7 in 1 records"),
    "other category names": (_rename_categories, "category_names is ['gemm', 'rest']"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_trace_is_a_problem_and_the_run_stays(tmp_path, case):
    change, message = MALFORMED[case]
    run = read_run(changed_file(write_profiled(tmp_path / "run.h5"), change))
    assert run.usable and run.summary["steps_measured"] == 5
    assert run.kernel_trace is None and run.kernel_trace_found
    (problem,) = run.problems
    assert problem.kind == "kernel trace" and not problem.excluded
    assert message in problem.message and "kernel profile is left out" in problem.message


def test_records_outside_the_window_and_a_window_unlike_traced_are_named(tmp_path):
    records = trace_records(TRACED, step_kernels(2)) + [("late_kernel", "other", 5 * MS)]
    records[-1] = (5,) + records[-1][:3]
    path = write_run(tmp_path / "run.h5", world_size=1, steps=STEPS, traced_steps=TRACED,
                     kernel_trace=[records])
    with h5py.File(path, "r+") as handle:
        handle["kernel_trace"].attrs["window_last"] = np.int64(5)
    run = read_run(path)
    assert run.usable and run.kernel_trace is not None
    messages = [p.message for p in run.problems if p.kind == "kernel trace"]
    assert len(messages) == 1 and "traced marks steps 3, 4" in messages[0]
    # The window now runs to step 5, so the late kernel is inside it and counted, and
    # every time is per window step (3 of them).
    times = category_times(run.kernel_trace).ms_per_step.loc[0]
    assert times["other"] == pytest.approx(5 / 3, rel=RTOL)
    assert times["gemm"] == pytest.approx(12 / 3, rel=RTOL)

    with h5py.File(path, "r+") as handle:
        handle["kernel_trace"].attrs["window_last"] = np.int64(4)
    run = read_run(path)
    messages = [p.message for p in run.problems if p.kind == "kernel trace"]
    assert messages == ["1 records name steps outside the window 3..4; left out of the "
                        "profile"]
    assert category_times(run.kernel_trace).ms_per_step.loc[0, "other"] == 0.0


def make_results(root):
    """Series A (ddp) profiled at N=1 and 2, one more N=2 run whose trace is malformed;
    series B (zero2) without any trace."""
    write_profiled(root / "a_n1.h5", comm_ms=(0,))
    write_profiled(root / "a_n2.h5", comm_ms=(2, 4))
    bad = write_profiled(root / "a_n2_r1.h5", comm_ms=(2, 4), config=base_config(repeat=1))
    with h5py.File(bad, "r+") as handle:
        del handle["kernel_trace/rank_0/step"]
        handle["kernel_trace"].attrs["tracing_overhead"] = 0.25   # ignored: malformed
    with h5py.File(root / "a_n2.h5", "r+") as handle:
        handle["kernel_trace"].attrs["tracing_overhead"] = 0.125  # shown as found
    for n in (1, 2):
        write_run(root / f"b_n{n}.h5", world_size=n, step_times=0.1,
                  config=base_config(strategy="zero2"))


def test_report_has_a_kernel_profile_with_four_plots_per_profiled_series(
        tmp_path, unnamed_in_report_help):
    results, out = tmp_path / "results", tmp_path / "out"
    make_results(results)
    assert main([str(results), "-o", str(out)]) == 0
    assert unnamed_in_report_help(out) == []
    report = (out / "report.md").read_text()
    linked = set(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report))
    written = {path.name for path in out.glob("*.png")}
    assert linked == written
    kernel_pngs = sorted(name for name in written if name.startswith("kernel_"))
    assert [name.split("_s0")[0] for name in kernel_pngs] == [
        "kernel_comm_share", "kernel_fraction", "kernel_imbalance", "kernel_time"]
    assert all("ddp" in name for name in kernel_pngs)          # none for the zero2 series
    assert all((out / name).stat().st_size > 0 for name in kernel_pngs)

    section = report.split("## Kernel profile", 1)[1].split("## Problems", 1)[0]
    assert "Runs with a kernel profile: 2 of 5 used runs" in section
    assert "malformed: 1" in section
    assert "zero2" not in section
    assert "Top 10 kernels of rank 1:" in section
    assert "`ncclDevKernel_AllReduce_Sum_f32_RING_LL`" in section
    assert "Tracing overhead as stored: 12.5 %" in section
    problems = report.split("## Problems", 1)[1]
    assert "a_n2_r1.h5" in problems and "missing /kernel_trace/rank_0/step" in problems

    top = pd.read_csv(out / "kernel_top.csv")
    assert sorted(set(zip(top["N"], top["rank"]))) == [(1, 0), (2, 0), (2, 1)]
    first = top[(top["N"] == 2) & (top["rank"] == 1)].iloc[0]
    assert (first["name"], first["calls"]) == ("ampere_sgemm_128x64_nn", 4)
    categories = pd.read_csv(out / "kernel_categories.csv")
    comm = categories[(categories["N"] == 2) & (categories["category"] == "communication")]
    assert comm["ms_per_step"].tolist() == pytest.approx([2.0, 4.0], rel=RTOL)
    runs = pd.read_csv(out / "runs.csv").set_index("path")
    assert runs.loc["a_n2.h5", "steps_traced"] == 2 and runs.loc["b_n2.h5", "steps_traced"] == 0
    assert runs.loc["a_n2.h5", "tracing_overhead"] == 0.125


def test_report_without_traces_has_no_kernel_profile(tmp_path):
    for n in (1, 2):
        write_run(tmp_path / "r" / f"{n}.h5", world_size=n, step_times=0.1)
    assert main([str(tmp_path / "r"), "-o", str(tmp_path / "out")]) == 0
    assert "Kernel profile" not in (tmp_path / "out" / "report.md").read_text()
    assert not list((tmp_path / "out").glob("kernel_*"))


def test_a_rank_without_records_counts_as_zero(tmp_path):
    path = write_run(tmp_path / "run.h5", world_size=2, steps=STEPS, traced_steps=TRACED,
                     kernel_trace=[trace_records(TRACED, step_kernels(2)), []])
    run = read_run(path)
    assert run.usable and run.problems == []
    assert run.kernel_trace.ranks[1].records == 0
    assert top_kernels(run.kernel_trace.ranks[1]).empty
    times = category_times(run.kernel_trace)
    assert times.ms_per_step.loc[1].sum() == 0.0 and times.fraction.loc[1].isna().all()
    # One rank of two does all the gemm work: max / mean = 6 / 3.
    assert imbalance(times.ms_per_step)["gemm"] == pytest.approx(2.0, rel=RTOL)
    out = tmp_path / "out"
    assert main([str(tmp_path), "-o", str(out)]) == 0
    assert "*No records in the window.*" in (out / "report.md").read_text()
