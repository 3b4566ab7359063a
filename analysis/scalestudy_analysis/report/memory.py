"""Memory per rank by kind against N (/memory): a table per series and one figure per
group of comparable series, a panel per strategy, so zero2's saving shows beside ddp."""
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from scalestudy_analysis.results.baseline import comparable_key  # noqa: E402
from scalestudy_analysis.render.markdown import fmt, table  # noqa: E402
from scalestudy_analysis.render.figures import Figure, legend_outside, save_figure, wrap_title  # noqa: E402
from scalestudy_analysis.results.schema import MEMORY_KIND_NAMES  # noqa: E402

KIND_COLOURS = {"parameters": "#4C72B0", "gradients": "#8172B3", "optimizer": "#55A868",
                "activations": "#64B5CD", "communication": "#DD8452", "other": "#B0B0B0"}


def _has_memory(run):
    return (run.memory_bytes is not None
            and np.shape(run.memory_bytes) == (run.world_size, len(MEMORY_KIND_NAMES)))


def _largest_rank(run):
    """Bytes by kind of the rank holding the most, and the highest measured peak."""
    per_rank = np.asarray(run.memory_bytes, dtype=np.float64)
    kinds = per_rank[int(np.argmax(per_rank.sum(axis=1)))]
    peak = (float(np.max(run.peak_bytes)) if run.peak_bytes is not None and np.size(run.peak_bytes)
            else np.nan)
    return kinds, peak


def memory_table(series):
    """One row per N with memory: the median over runs of the largest rank's bytes by
    kind (their sum is the total), of its measured peak and of the memory preflight's
    estimate (NaN where no run has one, as before version 6); empty without /memory."""
    by_n = defaultdict(list)
    for run in series.runs:
        if _has_memory(run):
            by_n[run.world_size].append((*_largest_rank(run), run.memory_estimate_bytes))
    rows = []
    for n in sorted(by_n):
        kinds = np.median(np.array([k for k, _, _ in by_n[n]]), axis=0)
        row = {"N": n, **dict(zip(MEMORY_KIND_NAMES, kinds))}
        row["total"] = float(kinds.sum())
        row["peak"] = float(np.nanmedian([p for _, p, _ in by_n[n]]))
        estimates = [e for _, _, e in by_n[n] if np.isfinite(e)]
        row["estimate"] = float(np.median(estimates)) if estimates else np.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["N", *MEMORY_KIND_NAMES, "total", "peak", "estimate"])


def _unit(values):
    largest = np.nanmax(values) if np.size(values) and np.isfinite(values).any() else 0
    return (2 ** 30, "GiB") if largest >= 2 ** 30 else (2 ** 20, "MiB")


def memory_markdown(frame, peak_source=""):
    """The memory section: per N the rank that holds the most, by kind, with total, measured
    peak and the preflight estimate where recorded, in one unit for the whole table."""
    if frame.empty:
        return "*No run of this series has /memory.*"
    scale, unit = _unit(frame[["total", "peak"]].to_numpy(dtype=float))
    columns = (*MEMORY_KIND_NAMES, "total", "peak")
    header = ["N"] + [f"{kind} ({unit})" for kind in MEMORY_KIND_NAMES] + [
        f"total ({unit})", f"measured peak ({unit})"]
    note = f" The peak is {peak_source}." if peak_source else ""
    if frame["estimate"].notna().any():
        columns += ("estimate",)
        header.append(f"estimate ({unit})")
        note += (" The estimate is the memory preflight's, of rank 0 before the run allocated: what "
                 "the buffers by kind add up to at their most.")
    rows = [[str(int(row["N"]))] + [fmt(row[c] / scale) for c in columns] for _, row in frame.iterrows()]
    return ("Memory of the rank that holds the most, by kind, after the last step (median "
            f"over runs).{note}\n\n" + table(header, rows))


def memory_figures(series_list, tables, out_dir):
    """One figure per group of comparable series (model, scaling, sequence, batch) with
    memory, a panel per series on a shared axis."""
    groups = defaultdict(list)
    for series in series_list:
        if not tables[series.index].empty:
            groups[comparable_key(series)].append(series)
    figures = []
    for number, (key, members) in enumerate(sorted(groups.items(), key=lambda g: str(g[0])), 1):
        frames = [tables[s.index] for s in members]
        scale, unit = _unit(np.concatenate([f[["total", "peak"]].to_numpy(dtype=float).ravel()
                                            for f in frames]))
        figure, axes = plt.subplots(1, len(members), figsize=(3.2 * len(members) + 2.5, 4.2),
                                    sharey=True, squeeze=False)
        for axis, series, frame in zip(axes[0], members, frames):
            positions = np.arange(len(frame))
            bottom = np.zeros(len(frame))
            for kind in MEMORY_KIND_NAMES:
                values = frame[kind].to_numpy(dtype=float) / scale
                axis.bar(positions, values, bottom=bottom, width=0.6, label=kind,
                         color=KIND_COLOURS[kind])
                bottom += values
            axis.scatter(positions, frame["peak"].to_numpy(dtype=float) / scale, marker="_",
                         s=500, color="black", zorder=3, label="measured peak")
            axis.set_xticks(positions)
            axis.set_xticklabels([str(int(n)) for n in frame["N"]])
            axis.set_xlabel("world size N")
            axis.set_title(f"{series.index}. {series.strategy_label}", fontsize="small")
            axis.grid(True, axis="y", alpha=0.3)
        axes[0][0].set_ylabel(f"per rank ({unit})")
        legend_outside(axes[0][-1])
        title = (f"Memory per rank by kind: {key[0]}, {key[1]} scaling, seq {key[2]}, "
                 f"batch {key[3]}")
        figure.suptitle(wrap_title(title, 100), fontsize="medium")
        name = f"memory_{number:02d}.png"
        figures.append(Figure(save_figure(figure, out_dir, name), title))
    return figures
