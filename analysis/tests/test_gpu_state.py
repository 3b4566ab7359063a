"""The GPUs' state per step (/steps/gpu_*, schema v3): reading v1 to v4 files, the numbers
of the report's "GPU state" section against hand-computed values, and malformed datasets.
The state by phase (v4) is in test_gpu_state_by_phase.py."""
import math

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.results.gpu_state import gpu_metrics, has_samples, reason_names
from scalestudy_analysis.results.load import load_results, read_run
from scalestudy_analysis.results.metrics import group_series
from scalestudy_analysis.report.report import write_report
from synth import (GPU_DATASETS, base_config, drop_steps_dataset,
                   replace_steps_dataset, reshape_steps_dataset, set_steps_value, write_run)

# Every expected value below is a median, minimum or maximum of stored numbers, or one
# weighted mean of seven terms, so they agree to rounding.
RTOL = 1e-12
NAN = math.nan
STEPS, WARMUP_STEPS, TRACED_STEPS = 7, 1, (4,)
MEASURED_ROWS = [1, 2, 3, 5, 6]

# Two ranks. Row 0 is warm-up and row 4 traced; their values are chosen so that any of
# them entering a number changes it. Rank 1 has no samples in row 5.
KNOWN = {
    "gpu_samples": [[5, 5], [10, 10], [10, 10], [20, 10], [50, 50], [10, 0], [10, 10]],
    "gpu_sm_clock_mhz": [[100, 100], [1980, 1900], [1950, 1970], [1800, 1990], [500, 500],
                         [1700, NAN], [1960, 1920]],
    "gpu_sm_clock_min_mhz": [[90, 95], [1900, 1850], [1900, 1950], [1500, 1980], [400, 450],
                             [1650, NAN], [1900, 1900]],
    "gpu_power_w": [[900, 900], [600, 620], [610, 640], [700, 650], [900, 900], [680, NAN],
                    [630, 600]],
    "gpu_temperature_c": [[40, 40], [60, 62], [63, 61], [70, 66], [90, 85], [71, NAN],
                          [65, 64]],
    "gpu_power_capped": [[1, 1], [0, 0.5], [0, 0], [0.25, 0], [1, 1], [1, NAN], [0, 0.2]],
    "gpu_clock_event_reasons": [[0x1, 0x1], [0x4, 0x4], [0, 0], [0x4 | 0x20, 0], [0x80, 0x80],
                                [0x4, 0], [0, 0x100]],
}

EXPECTED = {
    "samples": 100,                                 # 20 + 20 + 30 + 10 + 20
    # Slowest rank per measured step: 1900, 1950, 1800, 1700 (rank 1 has none), 1920.
    "sm_clock_slowest_rank_median_mhz": 1900.0,
    # 1700 1800 1900 1920 [1950] 1960 1970 1980 1990
    "sm_clock_median_mhz": 1950.0,
    "sm_clock_lowest_mhz": 1500.0,
    # 600 600 610 620 [630] 640 650 680 700
    "power_median_w": 630.0,
    "temperature_highest_c": 71.0,
    # (0.5 * 10 + 0.25 * 20 + 1.0 * 10 + 0.2 * 10) / 100
    "power_capped_fraction": 0.22,
    "clock_event_reasons": 0x4 | 0x20 | 0x100,
}


def write_known(path, gpu_state=None, **options):
    return write_run(path, world_size=2, steps=STEPS, warmup_steps=WARMUP_STEPS,
                     traced_steps=TRACED_STEPS, backend="cuda",
                     gpu_state=KNOWN if gpu_state is None else gpu_state, **options)


def assert_expected(metrics):
    for key, value in EXPECTED.items():
        assert metrics[key] == pytest.approx(value, rel=RTOL), key


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_version_1_to_4_files_load(tmp_path, version):
    gpu_state = KNOWN if version >= 3 else None
    path = write_run(tmp_path / f"v{version}.h5", world_size=2, steps=STEPS,
                     warmup_steps=WARMUP_STEPS, backend="cuda", schema_version=version,
                     gpu_state=gpu_state)
    run = read_run(path)
    assert run.usable and run.problems == [], [p.line() for p in run.problems]
    assert run.schema_version == version
    assert run.summary["steps_measured"] == STEPS - WARMUP_STEPS
    if version < 3:
        assert run.gpu_state is None and not has_samples(run)
        assert "gpu_telemetry_ms" not in run.config
        return
    assert run.config["gpu_telemetry_ms"] == "10"
    for name in GPU_DATASETS:
        values = getattr(run.gpu_state, name[len("gpu_"):])
        assert values.shape == (STEPS, 2), name
        np.testing.assert_array_equal(values, np.asarray(KNOWN[name], dtype=values.dtype))
    assert run.gpu_state.samples.dtype == np.int64
    assert run.gpu_state.clock_event_reasons.dtype == np.int64
    assert has_samples(run)


def test_a_run_without_samples_has_a_state_but_no_samples(tmp_path):
    run = read_run(write_run(tmp_path / "cpu.h5", world_size=2))
    assert run.usable and run.problems == []
    assert run.gpu_state is not None and not has_samples(run)
    assert run.gpu_state.samples.sum() == 0 and np.isnan(run.gpu_state.power_w).all()
    assert run.config["gpu_telemetry_ms"] == "0"


def test_gpu_numbers_match_hand_computed_values(tmp_path):
    run = read_run(write_known(tmp_path / "run.h5"))
    assert run.usable and run.problems == []
    metrics = gpu_metrics([run])
    assert_expected(metrics)
    assert metrics["steps"] == len(MEASURED_ROWS)
    assert reason_names(metrics["clock_event_reasons"]) == [
        "software power cap", "software thermal slowdown", "0x100"]


def test_report_section_and_csv_carry_the_hand_computed_values(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    write_known(results / "n2.h5")
    write_run(results / "n1.h5", world_size=1, backend="cuda",
              gpu_state={"gpu_samples": 0})   # telemetry on, but no sample arrived
    write_report(results, out)
    report = (out / "report.md").read_text()
    section = report.split("## GPU state", 1)[1].split("\n## ", 1)[0]
    assert "Runs with GPU samples: 1 of 2 used runs" in section
    (row,) = [line for line in section.splitlines() if line.startswith("| 2 |")]
    assert row == ("| 2 | 1 | 100 | 1900 | 1950 | 1500 | 630 | 71 | 22.0 % | "
                   "software power cap, software thermal slowdown, 0x100 |")
    assert not any(line.startswith("| 1 |") for line in section.splitlines())
    (csv_row,) = pd.read_csv(out / "gpu_state.csv").to_dict("records")
    assert csv_row["path"] == "n2.h5" and csv_row["N"] == 2 and csv_row["steps"] == 5
    assert csv_row["clock_event_reasons"] == "0x124"
    assert csv_row["clock_event_reason_names"] == ("software power cap; software thermal "
                                                   "slowdown; 0x100")
    assert_expected({**csv_row, "clock_event_reasons": int(csv_row["clock_event_reasons"], 16)})


def test_warmup_and_traced_steps_are_left_out(tmp_path):
    extreme = {name: np.array(values, dtype=float) for name, values in KNOWN.items()}
    for row in (0, 4):      # the warm-up step and the traced step
        for name, value in (("gpu_samples", 1000), ("gpu_sm_clock_mhz", 1.0),
                            ("gpu_sm_clock_min_mhz", 1.0), ("gpu_power_w", 5000.0),
                            ("gpu_temperature_c", 200.0), ("gpu_power_capped", 1.0),
                            ("gpu_clock_event_reasons", 0x40 | 0x8)):
            extreme[name][row] = value
    known = read_run(write_known(tmp_path / "known.h5"))
    changed = read_run(write_known(tmp_path / "changed.h5", gpu_state=extreme))
    assert gpu_metrics([changed]) == gpu_metrics([known])
    assert_expected(gpu_metrics([changed]))
    # The same rows do move every number once they count as measured.
    untraced = read_run(write_run(tmp_path / "all.h5", world_size=2, steps=STEPS,
                                  warmup_steps=0, backend="cuda", gpu_state=extreme))
    counted = gpu_metrics([untraced])
    for key in EXPECTED:
        assert counted[key] != pytest.approx(EXPECTED[key], rel=RTOL), key


MALFORMED = {
    "one rank too many": (reshape_steps_dataset("gpu_power_w", (STEPS, 3)),
                          "/steps/gpu_power_w has shape [7, 3], expected [S, R] = [7, 2]"),
    "one step short": (reshape_steps_dataset("gpu_samples", (STEPS - 1, 2)),
                       "/steps/gpu_samples has shape [6, 2], expected [S, R] = [7, 2]"),
    "one dimension": (reshape_steps_dataset("gpu_clock_event_reasons", (STEPS,)),
                      "/steps/gpu_clock_event_reasons has shape [7], expected"),
    "missing dataset": (drop_steps_dataset("gpu_temperature_c"), "missing /steps/gpu_temperature_c"),
    "negative samples": (set_steps_value("gpu_samples", (2, 1), -3),
                         "/steps/gpu_samples is negative in 1 step-rank cells"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_gpu_dataset_is_a_problem_and_the_run_stays(tmp_path, case,
                                                                 read_with_one_gpu_problem):
    change, message = MALFORMED[case]
    run, problem = read_with_one_gpu_problem(write_known(tmp_path / "run.h5"), change, message,
                                             len(MEASURED_ROWS))
    assert run.gpu_state is None and not has_samples(run)
    assert "GPU state is left out" in problem.message

    write_report(tmp_path, tmp_path / "out")
    report = (tmp_path / "out" / "report.md").read_text()
    assert "No run used has GPU samples" in report
    assert message in report.split("## Problems", 1)[1]


@pytest.mark.parametrize("version", [3, 4])
def test_a_version_3_or_4_file_without_any_gpu_dataset_is_named(tmp_path, version):
    path = write_known(tmp_path / "run.h5", schema_version=version)
    with h5py.File(path, "r+") as handle:
        for name in GPU_DATASETS:
            del handle[f"steps/{name}"]
    run = read_run(path)
    assert run.usable and run.gpu_state is None
    assert [(p.kind, p.excluded) for p in run.problems] == [("missing field", False)]
    assert f"no /steps/gpu_* in a schema version {version} file" in run.problems[0].message


def test_a_version_2_and_a_version_3_run_form_one_series(tmp_path):
    write_run(tmp_path / "v2_n1.h5", world_size=1, backend="cuda", schema_version=2)
    write_run(tmp_path / "v3_n2.h5", world_size=2, backend="cuda",
              gpu_state={"gpu_samples": 10, "gpu_sm_clock_mhz": 1980.0})
    write_run(tmp_path / "v3_n2_off.h5", world_size=2, backend="cuda",
              config=base_config(repeat=1, gpu_telemetry_ms=0))
    runs, _, problems = load_results(tmp_path)
    assert problems == [], [p.line() for p in problems]
    configs = {run.path.rsplit("/", 1)[-1]: run.config for run in runs}
    assert "gpu_telemetry_ms" not in configs["v2_n1.h5"]
    assert configs["v3_n2.h5"]["gpu_telemetry_ms"] == "10"
    assert configs["v3_n2_off.h5"]["gpu_telemetry_ms"] == "0"
    series_list, series_problems = group_series(runs)
    assert series_problems == [], [p.line() for p in series_problems]
    (series,) = series_list
    assert sorted(run.world_size for run in series.runs) == [1, 2, 2]
    assert series.variant == {}

    write_report(tmp_path, tmp_path / "out")
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Runs with GPU samples: 1 of 3 used runs" in report
    assert "None: every file was complete, readable and consistent." in report
    frame = pd.read_csv(tmp_path / "out" / "gpu_state.csv")
    assert frame["path"].tolist() == ["v3_n2.h5"]
    assert frame["sm_clock_median_mhz"].tolist() == [1980.0]


def test_without_samples_the_section_is_one_line_and_no_csv_is_written(tmp_path):
    write_run(tmp_path / "v2.h5", world_size=2, schema_version=2)
    write_run(tmp_path / "cpu.h5", world_size=1)
    write_report(tmp_path, tmp_path / "out")
    report = (tmp_path / "out" / "report.md").read_text()
    section = report.split("## GPU state\n\n", 1)[1].split("\n## ", 1)[0]
    assert section.strip().splitlines() == [
        "No run used has GPU samples (CPU backend, `--gpu-telemetry-ms 0`, no NVML, or "
        "files older than schema version 3)."]
    assert not (tmp_path / "out" / "gpu_state.csv").exists()
