"""The kernel profile of traced runs. Reading /kernel_trace of a run file
(docs/results-schema.md, version 2) into per-rank totals, with the checks that turn a
malformed trace into a reported problem rather than a wrong number or a crash; then, per
rank, the kernels that took the most GPU time and the time per category, and per series
the categories, the communication share and the load imbalance against world size; and
from these the report's "Kernel profile" section, present when any usable run carries
/kernel_trace: per series the categories against N with four figures (time and fraction
per category as stacked bars, the communication share and the load imbalance as lines),
and per world size one run's tracing overhead, time per category of every rank and each
rank's top kernels. kernel_top.csv and kernel_categories.csv hold the same for every rank
of every run.

Times are sums of record durations (end_ns - start_ns). Records on different streams may
overlap, so a rank's "traced GPU time" is summed kernel time, not the time its GPU was
busy; shares and fractions are of that sum. "Per step" divides a total over the window by
its length in steps (window_last - window_first + 1)."""
import math
from collections import defaultdict
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from scalestudy_analysis.report.markdown import figure_markdown, fmt, percent, relative, table  # noqa: E402
from scalestudy_analysis.report.plots import Figure, save_figure, world_size_axis, wrap_title  # noqa: E402
from scalestudy_analysis.results.reading import Problem, attributes, text_list  # noqa: E402
from scalestudy_analysis.results.schema import (COMMUNICATION_CATEGORY, KERNEL_CATEGORY_NAMES, KERNEL_KIND_NAMES,  # noqa: E402
                     KERNEL_LAUNCH_DATASETS, KERNEL_RECORD_DATASETS, KERNEL_TRACE_GROUP)
from scalestudy_analysis.report.timeline import ranks_to_show  # noqa: E402

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
    """CategoryTimes of one trace, per rank and category: the summed kernel time per traced
    step in ms, and the fraction of the rank's summed kernel time (NaN for a rank with none)."""
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
    """The runs that carry a readable kernel trace, in the order given."""
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


NAME_WIDTH = 90  # demangled template names run to hundreds of characters

DEFINITIONS = f"""\
- Source: `/kernel_trace` of runs made with `--profile-kernels`: every kernel, memcpy and
  memset of the traced window on every rank (CUPTI). Traced steps are slowed by the
  tracing, so they are left out of every other number in this report, like warm-up steps.
- **Kernel time**: the sum of the records' durations (end − start). Records on different
  streams may overlap, so a rank's kernel time can exceed the wall time it covers.
- **Per traced step**: a total over the window divided by the window's length in steps
  (window_last − window_first + 1).
- **Fraction** of a category: its part of the rank's kernel time, averaged over the ranks
  (and the repeats) at one N. **Communication share**: the fraction of `communication`
  (NCCL's kernels).
- **Load imbalance** of a category: max over ranks / mean over ranks of its time per traced
  step within one run (1 = balanced), averaged over the repeats at one N.
- **Tracing overhead**: the file's `tracing_overhead` as stored: mean step time of the
  traced steps / median of the untraced measured steps − 1.
- **Top {TOP_KERNELS} kernels**: per rank, the (name, category) pairs with the most kernel
  time; memcpy and memset records count as kernels here (category `memory`)."""


def _code(name):
    name = name if len(name) <= NAME_WIDTH else name[:NAME_WIDTH - 1] + "…"
    return "`" + name.replace("|", "\\|").replace("`", "'") + "`"


def _overheads(values):
    return ", ".join(percent(value) for value in values) or "—"


def _series_tables(profile):
    categories = list(KERNEL_CATEGORY_NAMES)
    rows = []
    for n in profile.sizes:
        cells = [f"{fmt(profile.ms_per_step.loc[n, c])} ({percent(profile.fraction.loc[n, c])})"
                 for c in categories]
        rows.append([str(n), str(int(profile.runs[n])), str(int(profile.traced_steps[n]))]
                    + cells + [percent(profile.comm_share[n]), _overheads(profile.overheads[n])])
    times = table(["N", "runs", "traced steps"] + categories
                  + ["communication share", "tracing overhead"], rows)
    rows = [[str(n)] + [fmt(profile.imbalance.loc[n, c], 3) for c in categories]
            for n in profile.sizes]
    return times, table(["N"] + categories, rows)


def _shown_ranks(trace):
    """All ranks of small runs; of large ones an even spread that keeps the rank with the
    most kernel time."""
    busiest = int(np.argmax([rank.total_ns for rank in trace.ranks])) if trace.ranks else 0
    return ranks_to_show(len(trace.ranks), busiest)


def _run_detail(run, results_dir):
    trace = run.kernel_trace
    times = category_times(trace)
    shown = _shown_ranks(trace)
    found = {key: trace.attribute(key) for key in ("traced_step_time_mean_s",
                                                     "untraced_step_time_median_s")}
    parts = [
        f"#### N={run.world_size}, repeat {run.repeat}: `{relative(run.path, results_dir)}`",
        "",
        f"- Window: steps {trace.window_first}..{trace.window_last} ({trace.traced_steps} "
        f"steps). Tracing overhead as stored: {percent(trace.attribute('tracing_overhead'))} "
        f"(traced step mean {fmt(found['traced_step_time_mean_s'])} s, untraced step median "
        f"{fmt(found['untraced_step_time_median_s'])} s).",
    ]
    if len(shown) < len(trace.ranks):
        parts.append(f"- {len(shown)} of {len(trace.ranks)} ranks shown (an even spread and "
                     "the rank with the most kernel time); all are in `kernel_top.csv` and "
                     "`kernel_categories.csv`.")
    rows = []
    for rank in shown:
        kernels = trace.ranks[rank]
        cells = [f"{fmt(times.ms_per_step.loc[rank, c])} ({percent(times.fraction.loc[rank, c])})"
                 for c in KERNEL_CATEGORY_NAMES]
        rows.append([str(rank), kernels.device or "—", str(kernels.records)] + cells
                    + [fmt(kernels.total_ns / 1e6 / trace.traced_steps)])
    parts += ["", "Per rank, ms per traced step (fraction of the rank's kernel time):", "",
              table(["rank", "device", "records"] + list(KERNEL_CATEGORY_NAMES)
                    + ["all (ms/step)"], rows), ""]
    for rank in shown:
        top = top_kernels(trace.ranks[rank])
        rows = [[str(position), _code(row.name), row.category, str(row.calls),
                 fmt(row.total_ms), fmt(row.mean_us), percent(row.share)]
                for position, row in enumerate(top.itertuples(index=False), start=1)]
        parts += [f"Top {TOP_KERNELS} kernels of rank {rank}:", ""]
        parts += [table(["#", "kernel", "category", "calls", "total (ms)", "mean (µs)",
                         "share"], rows) if rows else "*No records in the window.*", ""]
    return "\n".join(parts)


def _detail_runs(runs):
    """One run per world size, the lowest repeat, as the timeline picks one."""
    chosen = {}
    for run in sorted(profiled_runs(runs), key=lambda run: (_repeat_order(run), run.path)):
        chosen.setdefault(run.world_size, run)
    return [chosen[n] for n in sorted(chosen)]


def _repeat_order(run):
    try:
        return int(run.repeat)
    except ValueError:
        return 0


def _series_part(series, profile, out_dir, results_dir):
    times, imbalances = _series_tables(profile)
    parts = [f"### {series.index}. {series.label}", "",
             "Kernel time per traced step in ms, mean over ranks (fraction of kernel time):",
             "", times, "", "Load imbalance, max / mean over ranks of the time per traced step:",
             "", imbalances, ""]
    parts += [figure_markdown(figure) + "\n" for figure in kernel_figures(series, profile,
                                                                          out_dir)]
    parts += [_run_detail(run, results_dir) for run in _detail_runs(series.runs)]
    return "\n".join(parts)


def _csv_rows(series_list, results_dir):
    top_rows, category_rows = [], []
    for series in series_list:
        for run in profiled_runs(series.runs):
            trace = run.kernel_trace
            where = {"series": series.index, "path": relative(run.path, results_dir),
                     "N": run.world_size, "repeat": run.repeat}
            times = category_times(trace)
            for kernels in trace.ranks:
                for position, row in enumerate(top_kernels(kernels).to_dict("records"), 1):
                    top_rows.append({**where, "rank": kernels.rank, "position": position, **row})
                for category in KERNEL_CATEGORY_NAMES:
                    category_rows.append({**where, "rank": kernels.rank, "category": category,
                                          "ms_per_step": times.ms_per_step.loc[kernels.rank,
                                                                               category],
                                          "fraction": times.fraction.loc[kernels.rank,
                                                                         category]})
    return pd.DataFrame(top_rows), pd.DataFrame(category_rows)


def kernel_section(series_list, runs, out_dir, results_dir):
    """The section's markdown, or None when no usable run has /kernel_trace. Writes the
    figures and the two CSVs into out_dir."""
    found = [run for run in runs if run.usable and run.kernel_trace_found]
    if not found:
        return None
    usable = [run for run in runs if run.usable]
    profiled = profiled_runs(usable)
    parts = ["## Kernel profile", "", DEFINITIONS, "",
             f"- Runs with a kernel profile: {len(profiled)} of {len(usable)} used runs."]
    if len(found) > len(profiled):
        parts.append(f"- Runs whose `/kernel_trace` is malformed: {len(found) - len(profiled)}; "
                     "their profiles are left out (see Problems), their steps are used.")
    parts.append("")
    if not profiled:
        return "\n".join(parts).rstrip()
    top, categories = _csv_rows(series_list, results_dir)
    top.to_csv(out_dir / "kernel_top.csv", index=False)
    categories.to_csv(out_dir / "kernel_categories.csv", index=False)
    parts += ["Every rank's top kernels: `kernel_top.csv`; every rank's time per category: "
              "`kernel_categories.csv`.", ""]
    for series in series_list:
        profile = series_profile(series.runs)
        if profile is not None:
            parts += [_series_part(series, profile, out_dir, results_dir).rstrip(), ""]
    return "\n".join(parts).rstrip()


# Communication keeps the orange of the scaling plots' exposed communication.
CATEGORY_COLOURS = {"gemm": "#4C72B0", "attention": "#8172B3", "norm_elementwise": "#64B5CD",
                    "optimizer": "#55A868", "communication": "#DD8452", "memory": "#937860",
                    "other": "#B0B0B0"}


def _stacked_bars(profile, frame, ylabel, title, out_dir, name):
    figure, axis = plt.subplots(figsize=(7, 4.5))
    positions = np.arange(len(frame))
    bottom = np.zeros(len(frame))
    for category in profile.active_categories():
        values = np.nan_to_num(frame[category].to_numpy(dtype=float))
        axis.bar(positions, values, bottom=bottom, width=0.6, label=category,
                 color=CATEGORY_COLOURS.get(category))
        bottom += values
    # Bars stand for world sizes, which need not be evenly spaced: label, do not scale.
    axis.set_xticks(positions)
    axis.set_xticklabels([str(n) for n in profile.sizes])
    axis.set_xlabel("world size N (ranks)")
    axis.set_ylabel(ylabel)
    axis.set_title(wrap_title(title), fontsize="medium")
    axis.grid(True, axis="y", alpha=0.3)
    if profile.active_categories():
        axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return Figure(save_figure(figure, out_dir, name), title)


def category_time(series, profile, out_dir):
    """Figure: stacked bars per N of the summed kernel time per traced step (ms, mean over
    ranks) by category; writes kernel_time_<slug>.png under out_dir."""
    return _stacked_bars(profile, profile.ms_per_step,
                         "summed kernel time per traced step (ms), mean over ranks",
                         f"Kernel time per category: {series.label}", out_dir,
                         f"kernel_time_{series.slug}.png")


def category_fraction(series, profile, out_dir):
    """Figure: stacked bars per N of each category's fraction of the traced kernel time (mean
    over ranks); writes kernel_fraction_<slug>.png under out_dir."""
    return _stacked_bars(profile, profile.fraction,
                         "fraction of traced kernel time, mean over ranks",
                         f"Kernel time fraction per category: {series.label}", out_dir,
                         f"kernel_fraction_{series.slug}.png")


def comm_share(series, profile, out_dir):
    """Figure: the communication kernels' fraction (0 to 1) of all traced kernel time against
    N; writes kernel_comm_share_<slug>.png under out_dir."""
    title = f"Communication kernels' share of kernel time: {series.label}"
    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.plot(profile.sizes, profile.comm_share.to_numpy(dtype=float), marker="o",
              color=CATEGORY_COLOURS[COMMUNICATION_CATEGORY])
    world_size_axis(axis, profile.sizes)
    axis.set_ylim(0, 1)
    axis.set_ylabel("communication / all traced kernel time")
    axis.set_title(wrap_title(title), fontsize="medium")
    axis.grid(True, alpha=0.3)
    return Figure(save_figure(figure, out_dir, f"kernel_comm_share_{series.slug}.png"), title)


def load_imbalance(series, profile, out_dir):
    """Figure: per category, max over ranks / mean over ranks of the time per traced step
    against N (1 is balanced); writes kernel_imbalance_<slug>.png under out_dir."""
    title = f"Kernel load imbalance across ranks: {series.label}"
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for category in profile.active_categories():
        axis.plot(profile.sizes, profile.imbalance[category].to_numpy(dtype=float), marker="o",
                  label=category, color=CATEGORY_COLOURS.get(category))
    axis.axhline(1.0, color="black", linestyle="--", linewidth=1, label="balanced")
    world_size_axis(axis, profile.sizes)
    axis.set_ylim(bottom=0.9)  # the ratio is at least 1; keep the balanced line in view
    axis.set_ylabel("max over ranks / mean over ranks\nof the time per traced step")
    axis.set_title(wrap_title(title), fontsize="medium")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return Figure(save_figure(figure, out_dir, f"kernel_imbalance_{series.slug}.png"), title)


def kernel_figures(series, profile, out_dir):
    """The four figures of a series' SeriesKernelProfile, in the report's order: time,
    fraction, communication share, load imbalance."""
    return [category_time(series, profile, out_dir), category_fraction(series, profile, out_dir),
            comm_share(series, profile, out_dir), load_imbalance(series, profile, out_dir)]
