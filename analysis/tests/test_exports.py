"""The report's tables load without cleaning (docs/exports.md): intervals named for what
they are, one row per step instead of a packed cell, numbers as numbers, no dash or
multiplication sign in a text column, and every column in the data dictionary."""
import json
import re
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from scalestudy_analysis.report.cli import main
from scalestudy_analysis.results.schema import MEMORY_KIND_NAMES
from synth import base_config, write_run

ROOT = Path(__file__).resolve().parents[2]
DICTIONARY = ROOT / "docs" / "exports.md"
DATASET = ROOT / "examples" / "gpt2-small-strong-4xh200"
PARTS = ("compute", "optimizer", "exposed_comm", "data", "other")
KINDS = (*MEMORY_KIND_NAMES, "total", "peak")


def documented_columns(section):
    """The column names of one table of docs/exports.md, <part> and <kind> spelled out."""
    text = DICTIONARY.read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in body.splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
                for part in PARTS if "<part>" in name else (None,):
                    for kind in KINDS if "<kind>" in name else (None,):
                        names.add(name.replace("<part>", str(part)).replace("<kind>", str(kind)))
    return names


def text_cells(frame):
    return [value for column in frame.columns if not pd.api.types.is_numeric_dtype(frame[column])
            for value in frame[column].dropna()]


def test_the_series_tables_name_their_bands_and_keep_numbers_numeric(example_report):
    series = pd.read_csv(example_report / "series.csv")
    assert not [c for c in series.columns if c.endswith(("_lo", "_hi"))]
    assert {"tokens_per_s_q1", "tokens_per_s_q3", "efficiency_common_q1"} <= set(series.columns)
    assert (series["tokens_per_s_q1"] <= series["tokens_per_s_q3"]).all()
    document = json.loads((example_report / "series.json").read_text())
    for entry in document["series"]:
        assert entry["global_batch"] == 32 and entry["seq"] == 1024 and entry["grad_accum"] == 1
    assert set(series["topology"]) == {"1x1", "1x2", "1x4"}
    for name in ("series.csv", "runs.csv"):
        frame = pd.read_csv(example_report / name)
        assert not [cell for cell in text_cells(frame) if "—" in str(cell) or "×" in str(cell)]


def test_runs_csv_leaves_the_exposed_fraction_of_one_rank_empty(example_report):
    runs = pd.read_csv(example_report / "runs.csv")
    assert "step_times_s" not in runs.columns
    one = runs[runs["world_size"] == 1]
    assert len(one) == 6 and one["exposed_comm_fraction"].isna().all()
    assert runs.loc[runs["world_size"] > 1, "exposed_comm_fraction"].between(0, 1).all()
    # The file stores a number there; the export follows the report, not /summary.
    with h5py.File(DATASET / one["path"].iloc[0], "r") as handle:
        assert float(handle["summary"].attrs["exposed_comm_fraction"]) > 0


def test_steps_csv_has_one_row_per_step_and_gives_the_runs_medians(example_report):
    steps = pd.read_csv(example_report / "steps.csv")
    runs = pd.read_csv(example_report / "runs.csv")
    assert steps["measured"].dtype == bool
    assert len(steps) == 18 * 30  # 18 runs of 30 steps, 5 of them warm-up
    assert int(steps["warmup"].sum()) == 18 * 5
    for _, run in runs.iterrows():
        mine = steps[(steps["path"] == run["path"]) & steps["measured"]]
        assert len(mine) == run["steps_measured"]
        assert float(np.median(mine["step_time_s"])) == pytest.approx(run["step_time_median_s"], rel=1e-12)
    parts = steps[["compute_s", "optimizer_s", "exposed_comm_critical_s", "data_s", "other_s"]].sum(axis=1)
    # The parts cut each step: equal but for floating-point rounding of five sums.
    assert np.allclose(parts, steps["step_time_s"], rtol=1e-12, atol=0)


def test_every_exported_column_is_in_the_data_dictionary(example_report, tmp_path):
    runs = pd.read_csv(example_report / "runs.csv")
    with h5py.File(DATASET / runs["path"].iloc[0], "r") as handle:
        config_keys = set(handle["config"].attrs) | {f"config.{k}" for k in handle["config"].attrs}
    assert set(runs.columns) - config_keys - documented_columns("runs.csv") == set()
    steps = pd.read_csv(example_report / "steps.csv")
    assert set(steps.columns) - documented_columns("steps.csv") == set()
    series = pd.read_csv(example_report / "series.csv")
    assert set(series.columns) - documented_columns("series.csv") == set()
    for n in (1, 2):
        for repeat in range(3):
            for label, factor in (("a", 1.0), ("b", 1.05)):
                write_run(tmp_path / label / f"n{n}r{repeat}.h5", world_size=n,
                          step_times=factor * (0.1 + 0.1 / n), config=base_config(repeat=repeat))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "c")]) == 0
    compare = pd.read_csv(tmp_path / "c" / "compare.csv")
    assert {"throughput_ratio_ci_lo", "throughput_ratio_ci_hi"} <= set(compare.columns)
    assert set(compare.columns) - documented_columns("compare.csv") == set()
