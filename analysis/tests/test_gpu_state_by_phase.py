"""The GPUs' state by phase (/steps/gpu_phase_*, schema v4): reading v3 and v4 files, the
numbers of the report's tables by phase and gpu_state_by_phase.csv against hand-computed
values, the steps they leave out, and malformed datasets."""
import math

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.results.gpu_state import (gpu_metrics, gpu_phase_metrics, has_phase_samples,
                                           has_samples, rank_phase_rows, slowest_rank_clock)
from scalestudy_analysis.results.load import read_run
from scalestudy_analysis.report.report import write_report
from synth import (GPU_PHASE_DATASETS, PHASES, base_config, drop_steps_dataset,
                   replace_steps_dataset, reshape_steps_dataset, set_steps_value, write_run)

# Tolerance: none. Every expected value below is one of the stored numbers or the mean of
# two of them, all integers, which floats hold exactly; so the tests compare with ==.
NAN = math.nan
STEPS, WARMUP_STEPS, TRACED_STEPS = 7, 1, (4,)
MEASURED_ROWS = [1, 2, 3, 5, 6]
EXCLUDED_ROWS = [0, 4]      # warm-up and traced

# Per phase, (samples, SM clock, power), each [S, R] for two ranks; phases not named
# have no samples. Rows 0 and 4 are the excluded steps: values there would move every
# number, and the optimizer holds samples there only, so it has none in the measured
# steps. The whole step holds the most samples but is not shown by phase.
KNOWN_PHASES = {
    "forward": (
        [[9, 9], [3, 3], [3, 3], [3, 3], [9, 9], [3, 3], [3, 3]],
        [[100, 100], [1980, 1900], [1970, 1910], [1960, 1920], [100, 100], [1950, 1930],
         [1940, 1890]],
        [[900, 900], [600, 650], [610, 660], [620, 670], [900, 900], [630, 680], [640, 690]]),
    # Rank 0 has no sample in row 6.
    "backward": (
        [[9, 9], [4, 4], [4, 4], [4, 4], [9, 9], [4, 4], [0, 4]],
        [[100, 100], [1800, 1850], [1820, 1850], [1840, 1850], [100, 100], [1860, 1850],
         [NAN, 1850]],
        [[900, 900], [700, 740], [710, 750], [720, 760], [900, 900], [730, 770], [NAN, 780]]),
    # Shorter than the sampling period: a sample in a few steps only.
    "grad-comm": (
        [[1, 1], [0, 0], [1, 0], [0, 1], [1, 1], [1, 0], [0, 0]],
        [[100, 100], [NAN, NAN], [1700, NAN], [NAN, 1600], [100, 100], [1750, NAN],
         [NAN, NAN]],
        [[900, 900], [NAN, NAN], [400, NAN], [NAN, 410], [900, 900], [420, NAN], [NAN, NAN]]),
    "optimizer": (
        [[2, 2], [0, 0], [0, 0], [0, 0], [2, 2], [0, 0], [0, 0]],
        [[100, 100], [NAN, NAN], [NAN, NAN], [NAN, NAN], [100, 100], [NAN, NAN], [NAN, NAN]],
        [[900, 900], [NAN, NAN], [NAN, NAN], [NAN, NAN], [900, 900], [NAN, NAN], [NAN, NAN]]),
    "step": (
        [[20, 20], [10, 10], [10, 10], [10, 10], [20, 20], [10, 10], [10, 10]],
        [[100, 100], [1900, 1880], [1910, 1870], [1920, 1860], [100, 100], [1930, 1850],
         [1940, 1840]],
        [[900, 900], [650, 700], [660, 710], [670, 720], [900, 900], [680, 730], [690, 740]]),
}
PER_STEP = {"gpu_samples": 10, "gpu_sm_clock_mhz": 1900.0, "gpu_power_w": 600.0}

def phase_metrics(samples, slowest_rank_clock_mhz, power_median_w):
    return {"samples": samples, "sm_clock_slowest_rank_median_mhz": slowest_rank_clock_mhz,
            "power_median_w": power_median_w}


EXPECTED = {
    # Rank medians 1960 and 1910; power 600 ... 690 pooled: (640 + 650) / 2.
    "forward": phase_metrics(30, 1910.0, 645.0),
    # Rank medians (1820 + 1840) / 2 = 1830 and 1850; power 700 ... 780 pooled.
    "backward": phase_metrics(36, 1830.0, 740.0),
    # Rank medians (1700 + 1750) / 2 = 1725 and 1600; power 400, 410, 420.
    "grad-comm": phase_metrics(3, 1600.0, 410.0),
}
TABLE_HEADER = ("| N | runs | forward: SM clock, slowest rank (MHz) | forward: power (W) | "
                "backward: SM clock, slowest rank (MHz) | backward: power (W) | "
                "grad-comm: SM clock, slowest rank (MHz) | grad-comm: power (W) |")
TABLE_ROW = "| 2 | 1 | 1910 | 645 | 1830 | 740 | 1600 | 410 |"
# rank, phase, samples, steps with samples, median SM clock, median power.
CSV_ROWS = [
    (0, "forward", 15, 5, 1960.0, 620.0),
    (0, "backward", 16, 4, 1830.0, 715.0),
    (0, "grad-comm", 2, 2, 1725.0, 410.0),
    (0, "step", 50, 5, 1920.0, 670.0),
    (1, "forward", 15, 5, 1910.0, 670.0),
    (1, "backward", 20, 5, 1850.0, 760.0),
    (1, "grad-comm", 1, 1, 1600.0, 410.0),
    (1, "step", 50, 5, 1860.0, 720.0),
]
CSV_COLUMNS = ["rank", "phase", "samples", "steps_with_samples", "sm_clock_median_mhz",
               "power_median_w"]


def phase_arrays(by_phase):
    """/steps/gpu_phase_* values, [S, R, P], from per-phase (samples, clock, power)."""
    shape = (STEPS, 2, len(PHASES))
    arrays = {"gpu_phase_samples": np.zeros(shape, dtype=np.int64),
              "gpu_phase_sm_clock_mhz": np.full(shape, NAN),
              "gpu_phase_power_w": np.full(shape, NAN)}
    for phase, values in by_phase.items():
        for name, value in zip(GPU_PHASE_DATASETS, values):
            arrays[name][:, :, PHASES.index(phase)] = value
    return arrays


def write_known(path, by_phase=None, **options):
    options = {"world_size": 2, "steps": STEPS, "warmup_steps": WARMUP_STEPS,
               "traced_steps": TRACED_STEPS, "backend": "cuda", **options}
    return write_run(path, gpu_state=PER_STEP,
                     gpu_phase_state=phase_arrays(KNOWN_PHASES if by_phase is None
                                                  else by_phase), **options)


def all_metrics(runs, phases=tuple(EXPECTED)):
    return {phase: gpu_phase_metrics(runs, phase) for phase in phases}


def gpu_section(out):
    report = (out / "report.md").read_text()
    return report.split("## GPU state", 1)[1].split("\n## ", 1)[0]


def test_a_version_3_file_has_a_gpu_state_without_phases(tmp_path):
    path = write_run(tmp_path / "v3.h5", world_size=2, backend="cuda", schema_version=3,
                     gpu_state=PER_STEP)
    with h5py.File(path, "r") as handle:
        assert not any(name.startswith("gpu_phase_") for name in handle["steps"])
    run = read_run(path)
    assert run.usable and run.problems == [], [p.line() for p in run.problems]
    assert has_samples(run) and run.gpu_state.phases is None
    assert not has_phase_samples(run)


def test_a_version_4_file_carries_its_state_by_phase(tmp_path):
    run = read_run(write_known(tmp_path / "v4.h5", schema_version=4))
    assert run.usable and run.problems == [], [p.line() for p in run.problems]
    assert run.schema_version == 4 and has_samples(run) and has_phase_samples(run)
    written = phase_arrays(KNOWN_PHASES)
    for name in GPU_PHASE_DATASETS:
        values = getattr(run.gpu_state.phases, name[len("gpu_phase_"):])
        assert values.shape == (STEPS, 2, len(PHASES)), name
        assert values.dtype == written[name].dtype, name
        np.testing.assert_array_equal(values, written[name])


def test_a_version_4_run_without_samples_has_phases_but_no_table(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    run = read_run(write_run(results / "cpu.h5", world_size=2))
    assert run.usable and run.problems == []
    assert run.gpu_state.phases.samples.shape == (6, 2, len(PHASES))
    assert run.gpu_state.phases.samples.sum() == 0
    assert np.isnan(run.gpu_state.phases.sm_clock_mhz).all()
    assert not has_phase_samples(run)
    # Per-step samples alone: the per-step table, no table by phase.
    write_run(results / "cuda.h5", world_size=2, backend="cuda",
              config=base_config(repeat=1), gpu_state=PER_STEP)
    write_report(results, out)
    section = gpu_section(out)
    assert "Runs with GPU samples: 1 of 2 used runs" in section
    assert "By phase" not in section and "gpu_state_by_phase.csv" not in section
    assert not (out / "gpu_state_by_phase.csv").exists()


def test_phase_numbers_match_hand_computed_values(tmp_path):
    run = read_run(write_known(tmp_path / "run.h5"))
    assert all_metrics([run]) == EXPECTED
    assert [tuple(row[key] for key in CSV_COLUMNS) for row in rank_phase_rows(run)] == CSV_ROWS
    # No samples in the measured steps: no numbers, whatever the excluded steps hold.
    for phase in ("data", "optimizer", "param-gather"):
        metrics = gpu_phase_metrics([run], phase)
        assert metrics["samples"] == 0, phase
        assert math.isnan(metrics["sm_clock_slowest_rank_median_mhz"]), phase
        assert math.isnan(metrics["power_median_w"]), phase
        assert math.isnan(slowest_rank_clock(run, phase)), phase


def test_a_value_where_the_phase_held_no_sample_is_not_counted(tmp_path):
    # The schema stores NaN there; a number would mean nothing, so it must not count.
    stray = dict(KNOWN_PHASES)
    samples, clock, power = (np.array(values, dtype=float) for values in stray["backward"])
    clock[6, 0], power[6, 0] = 1.0, 5000.0          # rank 0 has no backward sample in row 6
    stray["backward"] = (samples.astype(np.int64), clock, power)
    run = read_run(write_known(tmp_path / "run.h5", by_phase=stray))
    assert run.problems == []
    assert all_metrics([run]) == EXPECTED
    assert [tuple(row[key] for key in CSV_COLUMNS) for row in rank_phase_rows(run)] == CSV_ROWS


def test_report_table_and_csv_by_phase_carry_the_hand_computed_values(
        tmp_path, unnamed_in_report_help):
    results, out = tmp_path / "results", tmp_path / "out"
    write_known(results / "n2.h5")
    write_report(results, out)
    assert unnamed_in_report_help(out) == []
    section = gpu_section(out)
    assert "Runs with GPU samples by phase: 1 of 1" in section
    assert "**Phase SM clock, slowest rank**" in section
    lines = section.splitlines()
    header = lines.index(TABLE_HEADER)
    assert lines[header - 2].startswith("By phase (")
    assert lines[header + 2] == TABLE_ROW
    # The optimizer's samples lie in excluded steps only, and param-gather has none.
    assert "optimizer:" not in section and "param-gather:" not in section
    frame = pd.read_csv(out / "gpu_state_by_phase.csv")
    assert frame.columns.tolist() == ["series", "path", "N", "repeat", "gpu_telemetry_ms"
                                      ] + CSV_COLUMNS
    assert [tuple(row) for row in frame[CSV_COLUMNS].itertuples(index=False)] == CSV_ROWS
    assert set(frame["path"]) == {"n2.h5"} and set(frame["N"]) == {2}
    assert set(frame["series"]) == {1} and set(frame["gpu_telemetry_ms"]) == {10}


def test_runs_at_one_n_take_the_median_of_their_slowest_ranks_and_pool_power(tmp_path):
    # Two more repeats whose rank 0 runs 300 and 1000 MHz slower in every phase, at 100 and
    # 200 W more on both ranks; and a version 3 run at the same N, with no phases to add.
    results = tmp_path / "results"
    write_known(results / "r0.h5")
    for repeat, (slower, more) in enumerate(((300, 100), (1000, 200)), start=1):
        changed = {}
        for phase, (samples, clock, power) in KNOWN_PHASES.items():
            clock = np.array(clock, dtype=float)
            clock[:, 0] -= slower
            changed[phase] = (samples, clock, np.array(power, dtype=float) + more)
        write_known(results / f"r{repeat}.h5", by_phase=changed,
                    config=base_config(repeat=repeat))
    write_run(results / "v3.h5", world_size=2, backend="cuda", schema_version=3,
              config=base_config(repeat=3), gpu_state=PER_STEP)
    runs = [read_run(results / f"r{repeat}.h5") for repeat in range(3)]
    # Slowest ranks: forward 1910, 1660 and 960; backward 1830, 1530 and 830; grad-comm
    # 1600, 1425 and 725: the middle ones, where a mean or pooling the runs' steps would
    # differ. Power pooled: forward 600 ... 890 (30 values), backward 700 ... 780,
    # 800 ... 880 and 900 ... 980 (27), grad-comm 400 410 420 500 510 520 600 610 620.
    assert all_metrics(runs) == {"forward": phase_metrics(90, 1660.0, 745.0),
                                 "backward": phase_metrics(108, 1530.0, 840.0),
                                 "grad-comm": phase_metrics(9, 1425.0, 510.0)}
    write_report(results, tmp_path / "out")
    section = gpu_section(tmp_path / "out")
    assert "Runs with GPU samples: 4 of 4 used runs" in section
    assert "Runs with GPU samples by phase: 3 of 4" in section
    assert "| 2 | 3 | 1660 | 745 | 1530 | 840 | 1425 | 510 |" in section.splitlines()
    frame = pd.read_csv(tmp_path / "out" / "gpu_state_by_phase.csv")
    assert frame.groupby("path").size().to_dict() == {"r0.h5": 8, "r1.h5": 8, "r2.h5": 8}
    assert frame.groupby("path")["repeat"].first().to_dict() == {"r0.h5": 0, "r1.h5": 1,
                                                                 "r2.h5": 2}


def _extreme_in(rows, by_phase):
    changed = {}
    for phase in PHASES:
        samples, clock, power = by_phase.get(phase, (0, NAN, NAN))
        samples = np.array(np.broadcast_to(samples, (STEPS, 2)), dtype=np.int64)
        clock = np.array(np.broadcast_to(clock, (STEPS, 2)), dtype=float)
        power = np.array(np.broadcast_to(power, (STEPS, 2)), dtype=float)
        samples[rows], clock[rows], power[rows] = 1000, 1.0, 5000.0
        changed[phase] = (samples, clock, power)
    return changed


def test_warmup_and_traced_steps_are_left_out(tmp_path):
    extreme = _extreme_in(EXCLUDED_ROWS, KNOWN_PHASES)
    results = tmp_path / "results"
    known = read_run(write_known(results / "known.h5"))
    changed = read_run(write_known(results / "changed.h5", by_phase=extreme,
                                   config=base_config(repeat=1)))
    assert all_metrics([changed]) == all_metrics([known]) == EXPECTED
    assert rank_phase_rows(changed) == rank_phase_rows(known)
    write_report(results, tmp_path / "out")
    section = gpu_section(tmp_path / "out")
    assert "optimizer:" not in section and "param-gather:" not in section
    assert TABLE_ROW.replace("| 1 |", "| 2 |", 1) in section.splitlines()
    # The same rows do move every number once they count as measured.
    counted = read_run(write_run(tmp_path / "all" / "run.h5", world_size=2, steps=STEPS,
                                 warmup_steps=0, backend="cuda", gpu_state=PER_STEP,
                                 gpu_phase_state=phase_arrays(extreme)))
    for phase, values in all_metrics([counted]).items():
        for key, value in values.items():
            assert value != EXPECTED[phase][key], (phase, key)
    write_report(tmp_path / "all", tmp_path / "out_all")
    assert "optimizer: power (W)" in gpu_section(tmp_path / "out_all")
    assert "param-gather: power (W)" in gpu_section(tmp_path / "out_all")


def _retype(name, dtype):
    def change(handle):
        replace_steps_dataset(name, np.nan_to_num(handle[f"steps/{name}"][()]).astype(dtype))(handle)
    return change


def _as_text(name):
    def change(handle):
        del handle[f"steps/{name}"]
        text = np.full((STEPS, 2, len(PHASES)), "600", dtype=object)
        handle.create_dataset(f"steps/{name}", data=text, dtype=h5py.string_dtype())
    return change


MALFORMED = {
    "no phase axis": (reshape_steps_dataset("gpu_phase_power_w", (STEPS, 2)),
                      "/steps/gpu_phase_power_w has shape [7, 2], expected [S, R, P] = "
                      "[7, 2, 7]"),
    "one step short": (reshape_steps_dataset("gpu_phase_samples", (STEPS - 1, 2, len(PHASES))),
                       "/steps/gpu_phase_samples has shape [6, 2, 7], expected"),
    "one phase short": (reshape_steps_dataset("gpu_phase_sm_clock_mhz", (STEPS, 2, len(PHASES) - 1)),
                        "/steps/gpu_phase_sm_clock_mhz has shape [7, 2, 6], expected"),
    "float samples": (_retype("gpu_phase_samples", np.float64),
                      "/steps/gpu_phase_samples has dtype float64, expected int64"),
    "integer clock": (_retype("gpu_phase_sm_clock_mhz", np.int64),
                      "/steps/gpu_phase_sm_clock_mhz has dtype int64, expected float64"),
    "text power": (_as_text("gpu_phase_power_w"),
                   "/steps/gpu_phase_power_w has dtype object, expected float64"),
    "missing dataset": (drop_steps_dataset("gpu_phase_power_w"), "missing /steps/gpu_phase_power_w"),
    "negative samples": (set_steps_value("gpu_phase_samples", (2, 1, 1), -3),
                         "/steps/gpu_phase_samples is negative in 1 step-rank-phase cells"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_phase_dataset_is_a_problem_and_the_per_step_state_stays(tmp_path, case,
                                                                            read_with_one_gpu_problem):
    change, message = MALFORMED[case]
    intact = read_run(write_known(tmp_path / "intact" / "run.h5"))
    run, problem = read_with_one_gpu_problem(write_known(tmp_path / "results" / "run.h5"), change,
                                             message, len(MEASURED_ROWS))
    assert "GPU state by phase is left out, its GPU state per step is kept" in problem.message
    assert run.gpu_state is not None and run.gpu_state.phases is None
    assert has_samples(run) and not has_phase_samples(run)
    assert gpu_metrics([run]) == gpu_metrics([intact])

    write_report(tmp_path / "results", tmp_path / "out")
    section = gpu_section(tmp_path / "out")
    assert "Runs with GPU samples: 1 of 1 used runs" in section
    assert any(line.startswith("| 2 | 1 | 100 | 1900 |") for line in section.splitlines())
    assert "By phase" not in section
    assert not (tmp_path / "out" / "gpu_state_by_phase.csv").exists()
    report = (tmp_path / "out" / "report.md").read_text()
    assert message in report.split("## Problems", 1)[1]


def test_a_version_4_file_without_any_phase_dataset_is_named(tmp_path):
    path = write_known(tmp_path / "run.h5", schema_version=4)
    with h5py.File(path, "r+") as handle:
        for name in GPU_PHASE_DATASETS:
            del handle[f"steps/{name}"]
    run = read_run(path)
    assert run.usable and has_samples(run) and run.gpu_state.phases is None
    assert [(p.kind, p.excluded) for p in run.problems] == [("missing field", False)]
    assert ("no /steps/gpu_phase_* in a schema version 4 file; read as no GPU samples by "
            "phase") == run.problems[0].message


def test_a_malformed_per_step_state_leaves_the_phases_unread(tmp_path):
    path = write_known(tmp_path / "run.h5")
    with h5py.File(path, "r+") as handle:
        reshape_steps_dataset("gpu_power_w", (STEPS, 3))(handle)
        drop_steps_dataset("gpu_phase_power_w")(handle)
    run = read_run(path)
    assert run.usable and run.gpu_state is None and not has_phase_samples(run)
    (problem,) = run.problems
    assert problem.kind == "gpu state" and "/steps/gpu_power_w has shape" in problem.message
