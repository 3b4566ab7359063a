"""The report's tables for other tools, which a notebook loads without cleaning: runs.csv
(one row per run), steps.csv (one row per step of every usable run, and steps.parquet
beside it where pyarrow is installed), series.csv and series.json (one row per series and
N with every number the report shows of it). docs/exports.md gives every column's meaning
and unit.

What makes them load clean: numbers are numbers (a config value that reads as a number is
written as one), a value that does not exist is empty in the CSVs and null in the JSON
(never "—"), text columns hold ASCII names ("1x4", not "1×4"), and an interval's ends are
named for what they are: _q1/_q3 for the quartiles."""
import importlib.util
import json
import math

import numpy as np
import pandas as pd

from scalestudy_analysis.results import machine
from scalestudy_analysis.results.load import shown_path
from scalestudy_analysis.results.schema import MEMORY_KIND_NAMES

# Columns of a series' scaling table that are exported, in order; the breakdown's and
# the common baseline's follow.
POINT_COLUMNS = (
    "N", "topology", "comm_scope", "link", "repeats", "runs", "steps", "step_time_median_s",
    "step_time_q1_s", "step_time_q3_s", "tokens_per_step", "tokens_per_s", "tokens_per_s_q1",
    "tokens_per_s_q3", "speedup", "speedup_q1", "speedup_q3", "efficiency", "efficiency_q1",
    "efficiency_q3", "karp_flatt", "comm_time_median_s", "comm_fraction_of_step",
    "exposed_comm_median_s", "exposed_comm_fraction", "exposed_fraction_of_step",
    "tflops_per_gpu", "peak_tflops_per_gpu", "mfu", "compute_spread", "efficiency_common",
    "efficiency_common_q1", "efficiency_common_q3", "baseline_series", "baseline_n")

# The per-step table's columns from a run's StepQuantities: (column, attribute).
STEP_QUANTITIES = (("step_time_s", "step_time"), ("comm_time_s", "comm_time"),
                   ("exposed_comm_s", "exposed_comm"), ("compute_s", "compute"),
                   ("optimizer_s", "optimizer"), ("exposed_comm_critical_s", "exposed_on_critical"),
                   ("data_s", "data"), ("other_s", "other"))

# What the report's text shows for "none" and for nodes × ranks, and what a table for
# other tools holds instead.
_NONE_SHOWN = "—"


def plain_text(value):
    """A text cell as other tools read it: "—" becomes missing, "×" an ASCII "x"."""
    if not isinstance(value, str):
        return value
    if value == _NONE_SHOWN:
        return None
    return value.replace("×", "x")


def number_or_text(value):
    """An int or float where the text reads as one ("32" → 32), else the text as given."""
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def clean_frame(frame):
    """A copy with every text column through plain_text."""
    frame = frame.copy()
    for column in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[column]):  # object, or pandas' str
            frame[column] = frame[column].map(plain_text)
    return frame


def runs_table(frame):
    """runs.csv: one row per run, the step times left to steps.csv. A run of one rank,
    or one without communication, exchanges nothing: its exposed fraction is missing, as
    in the report, although /summary stores 0 there."""
    frame = clean_frame(frame.drop(columns=["step_times_s"], errors="ignore"))
    if {"exposed_comm_fraction", "world_size", "comm_time_median_s"} <= set(frame.columns):
        silent = (frame["world_size"] <= 1) | (frame["comm_time_median_s"] == 0)
        frame.loc[silent, "exposed_comm_fraction"] = math.nan
    return frame


def steps_table(runs, results_dir):
    """One row per recorded step of every usable run: the run's path, N and repeat, the
    step's index and whether it is measured (neither warm-up nor traced), its tokens and
    loss, and its times: the step, communication and exposed communication (maxima over
    ranks) and the breakdown's parts on the slowest rank."""
    parts = []
    for run in runs:
        if not run.usable:
            continue
        columns = {"path": shown_path(run, results_dir), "world_size": run.world_size, "repeat": number_or_text(run.repeat),
                   "step": run.step_index, "warmup": run.warmup.astype(bool),
                   "traced": run.traced.astype(bool), "measured": run.measured,
                   "tokens": run.tokens, "loss": run.loss}
        for column, attribute in STEP_QUANTITIES:
            columns[column] = getattr(run.quantities, attribute)
        parts.append(pd.DataFrame(columns))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["path", "world_size", "repeat", "step", "warmup", "traced", "measured", "tokens",
                 "loss"] + [column for column, _ in STEP_QUANTITIES])


def write_steps(steps, out_dir):
    """steps.csv, and steps.parquet where pyarrow is installed; the files' names."""
    steps.to_csv(out_dir / "steps.csv", index=False)
    written = ["steps.csv"]
    if importlib.util.find_spec("pyarrow") is None:  # pandas writes Parquet through it
        return written
    steps.to_parquet(out_dir / "steps.parquet", index=False)
    return written + ["steps.parquet"]


def identity(series):
    """What names a series: its fields, what sets it apart, and its machine and build."""
    described = {}
    for run in series.runs:
        for key, value in machine.describe(run).items():
            described.setdefault(key, set()).add(value)
    return {"series": series.index, "label": series.label, "strategy": series.strategy_label,
            **{key: number_or_text(str(value)) for key, value in series.fields.items()
               if key != "strategy"},
            **{key: " + ".join(sorted(values)) for key, values in described.items()},
            "variant": "; ".join(f"{k}={v}" for k, v in sorted(series.variant.items()))}


def series_rows(series, details):
    """One dict per N: the series' identity, then its numbers."""
    table = series.table
    breakdown = [c for c in table.columns if c.startswith("breakdown_") or c.endswith("_mean_s")]
    memory = details.memory.set_index("N") if not details.memory.empty else None
    rows = []
    for _, point in table.iterrows():
        n = int(point["N"])
        row = identity(series)
        row.update({column: plain_text(point[column]) for column in POINT_COLUMNS if column in table})
        row.update({column: point[column] for column in breakdown})
        for kind in (*MEMORY_KIND_NAMES, "total", "peak"):
            row[f"memory_{kind}_bytes"] = (memory.loc[n, kind] if memory is not None
                                           and n in memory.index else math.nan)
        row["loss_departure"] = details.loss_departure.get(n, math.nan)
        rows.append(row)
    return rows


def _json_value(value):
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(value) else float(value)
    return value


def write_series(series_list, details, out_dir):
    """series.csv (flat) and series.json (a list of series, each with its points); a
    missing value is empty in the CSV and null in the JSON."""
    rows = [row for series in series_list for row in series_rows(series, details[series.index])]
    pd.DataFrame(rows).to_csv(out_dir / "series.csv", index=False)
    document = []
    for series in series_list:
        points = series_rows(series, details[series.index])
        named = identity(series)
        document.append({**{k: _json_value(v) for k, v in named.items()}, "points": [
            {k: _json_value(v) for k, v in point.items() if k not in named} for point in points]})
    (out_dir / "series.json").write_text(json.dumps({"series": document}, indent=1),
                                         encoding="utf-8")


def write_exports(runs, frame, series_list, details, results_dir, out_dir):
    """Every table for other tools; the names of the files written."""
    runs_table(frame).to_csv(out_dir / "runs.csv", index=False)
    write_series(series_list, details, out_dir)
    return ["runs.csv", *write_steps(steps_table(runs, results_dir), out_dir),
            "series.csv", "series.json"]
