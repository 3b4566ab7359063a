"""A run's /kernel_trace (docs/results-schema.md, version 2), the one reader of it: into
per-rank totals, with the checks that turn a malformed trace into a reported problem rather
than a wrong number or a crash, for the kernel profile (bench/kernels.py); and as its
records, for the Perfetto trace (report/trace.py, kernel_records).

Times are sums of record durations (end_ns - start_ns); "per step" divides a total over the
window by its length in steps (window_last - window_first + 1)."""
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scalestudy_analysis.results.reading import Problem, attributes, text_list
from scalestudy_analysis.results.schema import (KERNEL_CATEGORY_NAMES, KERNEL_KIND_NAMES, KERNEL_LAUNCH_DATASETS,
                                                KERNEL_RECORD_DATASETS, KERNEL_TRACE_GROUP)

PROBLEM_KIND = "kernel trace"
# Columns read in full; the others are only checked for presence and shape, since no
# number of the profile depends on them and a large window holds millions of rows.
_READ_COLUMNS = ("step", "kind", "category", "name", "stream", "start_ns", "end_ns")


class MalformedTrace(Exception):
    """The trace breaks the schema; the message names the dataset or attribute."""


@dataclass
class RankKernels:
    """One rank's records reduced to totals. Every number of the profile is a sum over
    records, so the records themselves are not kept."""
    rank: int
    device: str
    records: int                # records inside the window
    kernels: pd.DataFrame       # one row per (name, category): name, category, calls, total_ns
    category_ns: np.ndarray     # [C] summed durations per category, C = KERNEL_CATEGORY_NAMES

    @property
    def total_ns(self):
        return float(self.category_ns.sum())


@dataclass
class KernelTrace:
    """One run's /kernel_trace: the traced steps window_first..window_last, the group's
    attributes and every rank's kernel times; records outside the window are only counted
    (outside_window)."""
    window_first: int
    window_last: int
    attrs: dict                 # the group's attributes as found, the overhead included
    ranks: list                 # RankKernels of ranks 0 .. R-1
    outside_window: int = 0     # records whose step lies outside the window; not counted

    @property
    def traced_steps(self):
        return self.window_last - self.window_first + 1

    def attribute(self, key):
        """A float attribute as the writer stored it; NaN when absent or not a number."""
        try:
            return float(self.attrs[key])
        except (KeyError, TypeError, ValueError):
            return math.nan


def _problem(path, message):
    # The steps and the summary do not depend on the trace, so the run stays in every
    # scaling number; only its kernel profile is dropped.
    return Problem(path, PROBLEM_KIND, message, False)


def read_kernel_trace(handle, path, world_size, step_index, traced):
    """(trace, problems) for an open run file. trace is None when the file has no
    /kernel_trace and when its trace is malformed, which is then the one problem."""
    if KERNEL_TRACE_GROUP not in handle:
        return None, []
    try:
        trace = _read_trace(handle[KERNEL_TRACE_GROUP], world_size)
    except MalformedTrace as error:
        return None, [_problem(path, f"{error}; the run's kernel profile is left out")]
    except (OSError, KeyError, ValueError, TypeError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        return None, [_problem(path, f"{KERNEL_TRACE_GROUP} unreadable ({first_line}); the "
                                     "run's kernel profile is left out")]
    return trace, _window_problems(path, trace, step_index, traced)


def _read_trace(group, world_size):
    for required in ("category_names", "window_first", "window_last", "window_units"):
        if required not in group.attrs:
            raise MalformedTrace(f"missing attribute {required} on {KERNEL_TRACE_GROUP}")
    attrs = attributes(group)
    names = text_list(group.attrs["category_names"])
    if tuple(names) != KERNEL_CATEGORY_NAMES:
        raise MalformedTrace(f"{KERNEL_TRACE_GROUP} category_names is {names}, expected "
                             f"{list(KERNEL_CATEGORY_NAMES)}")
    if attrs["window_units"] != "step":
        raise MalformedTrace(f"{KERNEL_TRACE_GROUP} window_units is {attrs['window_units']!r}; "
                             "a run's window is in steps")
    first, last = int(attrs["window_first"]), int(attrs["window_last"])
    if last < first:
        raise MalformedTrace(f"{KERNEL_TRACE_GROUP} window_last {last} is before window_first "
                             f"{first}")
    expected = {f"rank_{rank}" for rank in range(world_size)}
    extra = sorted(key for key in set(group.keys()) - expected if key.startswith("rank_"))
    if extra:
        raise MalformedTrace(f"{KERNEL_TRACE_GROUP} holds {', '.join(extra)}, world_size is "
                             f"{world_size}")
    read = [_read_rank(group, rank, first, last) for rank in range(world_size)]
    return KernelTrace(first, last, attrs, [rank for rank, _ in read],
                       sum(outside for _, outside in read))


def _index_check(values, size, where, table):
    bad = (values < 0) | (values >= size)
    if bad.any():
        raise MalformedTrace(f"{where} holds {int(values[bad][0])} in {int(bad.sum())} "
                             f"records, outside {table} ({size} entries)")


def _read_rank(group, rank, first, last):
    """(RankKernels, records outside the window) of one rank's subgroup."""
    where = f"{KERNEL_TRACE_GROUP}/rank_{rank}"
    if f"rank_{rank}" not in group:
        raise MalformedTrace(f"missing {where}")
    sub = group[f"rank_{rank}"]
    for name in KERNEL_RECORD_DATASETS + KERNEL_LAUNCH_DATASETS + ("names", "stream_names"):
        if name not in sub:
            raise MalformedTrace(f"missing {where}/{name}")
    if sub["step"].ndim != 1:
        raise MalformedTrace(f"{where}/step has shape {sub['step'].shape}, expected [N]")
    rows = sub["step"].shape[0]
    for name in KERNEL_RECORD_DATASETS:
        if sub[name].shape != (rows,):
            raise MalformedTrace(f"{where}/{name} has shape {list(sub[name].shape)}, expected "
                                 f"[{rows}] like {where}/step")
    for name in KERNEL_LAUNCH_DATASETS:
        if sub[name].shape != (rows, 3):
            raise MalformedTrace(f"{where}/{name} has shape {list(sub[name].shape)}, expected "
                                 f"[{rows}, 3]")
    columns = {}
    for name in _READ_COLUMNS:
        values = sub[name][()]
        if values.dtype.kind not in "iu":
            raise MalformedTrace(f"{where}/{name} has type {values.dtype}, expected integers")
        columns[name] = values.astype(np.int64)
    names = text_list(sub["names"][()]) if sub["names"].size else []
    n_streams = int(sub["stream_names"].size)
    _index_check(columns["category"], len(KERNEL_CATEGORY_NAMES), f"{where}/category",
                 "category_names")
    _index_check(columns["kind"], len(KERNEL_KIND_NAMES), f"{where}/kind", "kind_names")
    _index_check(columns["name"], len(names), f"{where}/name", f"{where}/names")
    _index_check(columns["stream"], n_streams, f"{where}/stream", f"{where}/stream_names")
    duration = columns["end_ns"] - columns["start_ns"]
    if (duration < 0).any():
        raise MalformedTrace(f"{int((duration < 0).sum())} records of {where} end before they "
                             "start")

    inside = (columns["step"] >= first) & (columns["step"] <= last)
    category = columns["category"][inside]
    name_index = columns["name"][inside]
    duration = duration[inside].astype(np.float64)
    n_categories = len(KERNEL_CATEGORY_NAMES)
    # One key per (name, category): a cuBLAS kernel launched by two ops keeps both tags.
    keys, inverse = np.unique(name_index * n_categories + category, return_inverse=True)
    inverse = inverse.reshape(-1)
    kernels = pd.DataFrame({
        "name": [names[key // n_categories] for key in keys],
        "category": [KERNEL_CATEGORY_NAMES[key % n_categories] for key in keys],
        "calls": np.bincount(inverse, minlength=keys.size).astype(np.int64),
        "total_ns": np.bincount(inverse, weights=duration, minlength=keys.size),
    })
    category_ns = np.bincount(category, weights=duration, minlength=n_categories)
    device = str(attributes(sub).get("device", ""))
    return (RankKernels(rank, device, int(inside.sum()), kernels, category_ns.astype(np.float64)),
            int((~inside).sum()))


def _step_list(steps):
    shown = ", ".join(str(step) for step in steps[:8])
    return (shown + (", ..." if len(steps) > 8 else "")) or "none"


def _window_problems(path, trace, step_index, traced):
    """Disagreements between the trace and /steps that leave the profile usable: the
    times per step still divide by the window's length, as the schema defines them."""
    problems = []
    first, last = trace.window_first, trace.window_last
    if trace.outside_window:
        problems.append(_problem(path, f"{trace.outside_window} records name steps outside "
                                       f"the window {first}..{last}; left out of the profile"))
    marked = sorted(int(step) for step in np.asarray(step_index)[np.asarray(traced) != 0])
    if marked != list(range(first, last + 1)):
        problems.append(_problem(path, f"/steps/traced marks steps {_step_list(marked)} but the "
                                       f"trace window is {first}..{last}; times per step "
                                       f"divide by the window's {trace.traced_steps} steps"))
    return problems


def kernel_records(handle):
    """{rank: (kernel names, stream names, record columns)} as /kernel_trace stores them,
    every record, unchecked (the Perfetto trace draws them); empty without one."""
    if KERNEL_TRACE_GROUP not in handle:
        return {}
    records = {}
    for key, sub in handle[KERNEL_TRACE_GROUP].items():
        if key.startswith("rank_"):
            records[int(key[5:])] = (text_list(sub["names"][()]), text_list(sub["stream_names"][()]),
                                     {name: sub[name][()] for name in ("step", "name", "stream",
                                                                       "start_ns", "end_ns")})
    return records
