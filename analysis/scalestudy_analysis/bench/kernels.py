"""The kernel profile of traced runs, from each rank's totals that results/kernel_trace.py
reads: per rank, the kernels that took the most GPU time and the time per category, and
per series the categories, the communication share and the load imbalance against world
size; and from these the report's "Kernel profile" section, present when any usable run
carries /kernel_trace: per series the categories against N with four figures (time and
fraction per category as stacked bars, the communication share and the load imbalance as
lines), and per world size one run's tracing overhead, time per category of every rank and
each rank's top kernels. kernel_top.csv and kernel_categories.csv hold the same for every
rank of every run.

Records on different streams may overlap, so a rank's "traced GPU time" is summed kernel
time, not the time its GPU was busy; shares and fractions are of that sum."""
from collections import defaultdict
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from scalestudy_analysis.render.markdown import figure_markdown, fmt, percent, relative, table  # noqa: E402
from scalestudy_analysis.render.figures import Figure, ranks_to_show, save_figure, world_size_axis, wrap_title  # noqa: E402
from scalestudy_analysis.results.schema import COMMUNICATION_CATEGORY, KERNEL_CATEGORY_NAMES  # noqa: E402

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
