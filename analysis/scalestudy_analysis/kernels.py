"""The kernel profile of traced runs: per rank, the kernels that took the most GPU time and
the time per category; per series, the categories, the communication share and the load
imbalance against world size.

Times are sums of record durations (end_ns - start_ns). Records on different streams may
overlap, so a rank's "traced GPU time" is summed kernel time, not the time its GPU was
busy; shares and fractions are of that sum. "Per step" divides a total over the window by
its length in steps (window_last - window_first + 1).
"""
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .schema import COMMUNICATION_CATEGORY, KERNEL_CATEGORY_NAMES

TOP_KERNELS = 10


def top_kernels(rank_kernels, count=TOP_KERNELS):
    """The rank's `count` (name, category) pairs with the most total time: name, category,
    calls, total_ms, mean_us and share of the rank's traced GPU time. Ties go by name, so
    the order does not depend on the order of the records."""
    table = rank_kernels.kernels.sort_values(["total_ns", "name", "category"],
                                             ascending=[False, True, True], kind="mergesort")
    table = table.head(count)
    total = rank_kernels.total_ns
    return pd.DataFrame({
        "name": table["name"].to_numpy(dtype=object),
        "category": table["category"].to_numpy(dtype=object),
        "calls": table["calls"].to_numpy(dtype=np.int64),
        "total_ms": table["total_ns"].to_numpy(dtype=float) / 1e6,
        "mean_us": table["total_ns"].to_numpy(dtype=float) / table["calls"].to_numpy() / 1e3,
        "share": table["total_ns"].to_numpy(dtype=float) / total if total > 0 else np.nan,
    })


@dataclass
class CategoryTimes:
    """One run's ranks (rows) by category (columns)."""
    ms_per_step: pd.DataFrame   # summed kernel time per traced step, ms
    fraction: pd.DataFrame      # of the rank's summed kernel time; NaN for a rank with none


def category_times(trace):
    ns = np.array([rank.category_ns for rank in trace.ranks], dtype=float)
    ns = ns.reshape(len(trace.ranks), len(KERNEL_CATEGORY_NAMES))
    index = pd.Index([rank.rank for rank in trace.ranks], name="rank")
    totals = ns.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(totals > 0, ns / totals, np.nan)
    return CategoryTimes(
        pd.DataFrame(ns / 1e6 / trace.traced_steps, index=index, columns=KERNEL_CATEGORY_NAMES),
        pd.DataFrame(fraction, index=index, columns=KERNEL_CATEGORY_NAMES))


def imbalance(ms_per_step):
    """Per category, max over ranks / mean over ranks of the time per step: 1 when every
    rank spends the same, N when one rank of N does all of it. NaN for a category no
    rank ran, where the ratio means nothing."""
    mean = ms_per_step.mean(axis=0)
    return (ms_per_step.max(axis=0) / mean.where(mean > 0)).astype(float)


@dataclass
class SeriesKernelProfile:
    """Rows: world sizes N; columns: categories. Every value is over all ranks of all
    profiled runs at N (repeats pooled; every run at N has N ranks, so each run weighs
    the same)."""
    runs: pd.Series             # profiled runs per N
    traced_steps: pd.Series     # traced steps per run, summed over the runs at N
    ms_per_step: pd.DataFrame   # mean over ranks
    fraction: pd.DataFrame      # mean over ranks of the per-rank fraction
    imbalance: pd.DataFrame     # max/mean over the ranks of one run, mean over runs
    overheads: pd.Series        # tracing_overhead of each run at N, as found (lists)

    @property
    def sizes(self):
        return [int(n) for n in self.ms_per_step.index]

    @property
    def comm_share(self):
        return self.fraction[COMMUNICATION_CATEGORY]

    def active_categories(self):
        """Categories with any time at any N, in schema order: a stacked bar or a legend
        of seven entries, most of them empty, reads worse."""
        totals = self.ms_per_step.sum(axis=0)
        return [name for name in KERNEL_CATEGORY_NAMES if totals[name] > 0]


def profiled_runs(runs):
    return [run for run in runs if run.kernel_trace is not None]


def series_profile(runs):
    """The profile of one series against N, or None when none of its runs is profiled."""
    by_n = defaultdict(list)
    for run in sorted(profiled_runs(runs), key=lambda run: (str(run.repeat), run.path)):
        by_n[run.world_size].append(run)
    if not by_n:
        return None
    sizes = sorted(by_n)
    ms_rows, fraction_rows, imbalance_rows = [], [], []
    for n in sizes:
        tables = [category_times(run.kernel_trace) for run in by_n[n]]
        ms_rows.append(pd.concat([t.ms_per_step for t in tables]).mean(axis=0))
        fraction_rows.append(pd.concat([t.fraction for t in tables]).mean(axis=0))
        imbalance_rows.append(pd.concat([imbalance(t.ms_per_step) for t in tables],
                                        axis=1).mean(axis=1))
    index = pd.Index(sizes, name="N")

    def frame(rows):
        return pd.DataFrame(rows, index=index, columns=list(KERNEL_CATEGORY_NAMES)).astype(float)

    return SeriesKernelProfile(
        runs=pd.Series([len(by_n[n]) for n in sizes], index=index),
        traced_steps=pd.Series([sum(r.kernel_trace.traced_steps for r in by_n[n])
                                for n in sizes], index=index),
        ms_per_step=frame(ms_rows),
        fraction=frame(fraction_rows),
        imbalance=frame(imbalance_rows),
        overheads=pd.Series([[r.kernel_trace.attribute("tracing_overhead") for r in by_n[n]]
                             for n in sizes], index=index),
    )
