"""series.csv and series.json beside runs.csv: one row per series and N with every number
the report shows of it (speedup, efficiency with its interval, communication and exposed
fractions, MFU, the breakdown, memory, the loss's departure), for other tools."""
import json
import math

import numpy as np
import pandas as pd

from . import machine
from .schema import MEMORY_KIND_NAMES

# Columns of a series' scaling table that are exported, in order; the breakdown's and
# the common baseline's follow.
POINT_COLUMNS = (
    "N", "topology", "comm_scope", "link", "repeats", "runs", "steps", "step_time_median_s", "step_time_q1_s", "step_time_q3_s",
    "tokens_per_step", "tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi", "speedup",
    "speedup_lo", "speedup_hi", "efficiency", "efficiency_lo", "efficiency_hi", "karp_flatt",
    "comm_time_median_s", "comm_fraction_of_step", "exposed_comm_median_s",
    "exposed_comm_fraction", "exposed_fraction_of_step", "tflops_per_gpu",
    "peak_tflops_per_gpu", "mfu", "compute_spread", "efficiency_common", "efficiency_common_lo",
    "efficiency_common_hi", "baseline_series", "baseline_n")


def _identity(series):
    """What names a series: its fields, what sets it apart, and its machine and build."""
    described = {}
    for run in series.runs:
        for key, value in machine.describe(run).items():
            described.setdefault(key, set()).add(value)
    return {"series": series.index, "label": series.label, "strategy": series.strategy_label,
            **{key: str(value) for key, value in series.fields.items() if key != "strategy"},
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
        row = _identity(series)
        row.update({column: point[column] for column in POINT_COLUMNS if column in table})
        row.update({column: point[column] for column in breakdown})
        for kind in (*MEMORY_KIND_NAMES, "total", "peak"):
            row[f"memory_{kind}_bytes"] = (memory.loc[n, kind] if memory is not None
                                           and n in memory.index else math.nan)
        row["loss_departure"] = details.loss_departure.get(n, math.nan)
        rows.append(row)
    return rows


def _plain(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if not math.isfinite(value) else float(value)
    return value


def write_series_exports(series_list, details, out_dir):
    """Writes series.csv (flat) and series.json (a list of series, each with its points);
    NaN is empty in the CSV and null in the JSON."""
    rows = [row for series in series_list for row in series_rows(series, details[series.index])]
    pd.DataFrame(rows).to_csv(out_dir / "series.csv", index=False)
    document = []
    for series in series_list:
        points = series_rows(series, details[series.index])
        identity = _identity(series)
        document.append({**identity, "points": [
            {k: _plain(v) for k, v in point.items() if k not in identity} for point in points]})
    (out_dir / "series.json").write_text(json.dumps({"series": document}, indent=1),
                                         encoding="utf-8")
