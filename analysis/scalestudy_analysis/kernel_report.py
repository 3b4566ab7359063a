"""The report's "Kernel profile" section, present when any usable run carries
/kernel_trace: per series the categories against N with four figures (time and fraction
per category as stacked bars, the communication share and the load imbalance as lines),
and per world size one run's tracing overhead, time per category of every rank and each
rank's top kernels. kernel_top.csv and kernel_categories.csv hold the same for every rank
of every run."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .kernels import TOP_KERNELS, category_times, profiled_runs, series_profile, top_kernels  # noqa: E402
from .markdown import figure_markdown, fmt, percent, relative, table  # noqa: E402
from .plots import Figure, _save, _world_size_axis, _wrap  # noqa: E402
from .schema import COMMUNICATION_CATEGORY, KERNEL_CATEGORY_NAMES  # noqa: E402
from .timeline import ranks_to_show  # noqa: E402

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
    axis.set_title(_wrap(title), fontsize="medium")
    axis.grid(True, axis="y", alpha=0.3)
    if profile.active_categories():
        axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return Figure(_save(figure, out_dir, name), title)


def category_time(series, profile, out_dir):
    return _stacked_bars(profile, profile.ms_per_step,
                         "summed kernel time per traced step (ms), mean over ranks",
                         f"Kernel time per category: {series.label}", out_dir,
                         f"kernel_time_{series.slug}.png")


def category_fraction(series, profile, out_dir):
    return _stacked_bars(profile, profile.fraction,
                         "fraction of traced kernel time, mean over ranks",
                         f"Kernel time fraction per category: {series.label}", out_dir,
                         f"kernel_fraction_{series.slug}.png")


def comm_share(series, profile, out_dir):
    title = f"Communication kernels' share of kernel time: {series.label}"
    figure, axis = plt.subplots(figsize=(7, 4.5))
    axis.plot(profile.sizes, profile.comm_share.to_numpy(dtype=float), marker="o",
              color=CATEGORY_COLOURS[COMMUNICATION_CATEGORY])
    _world_size_axis(axis, profile.sizes)
    axis.set_ylim(0, 1)
    axis.set_ylabel("communication / all traced kernel time")
    axis.set_title(_wrap(title), fontsize="medium")
    axis.grid(True, alpha=0.3)
    return Figure(_save(figure, out_dir, f"kernel_comm_share_{series.slug}.png"), title)


def load_imbalance(series, profile, out_dir):
    title = f"Kernel load imbalance across ranks: {series.label}"
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for category in profile.active_categories():
        axis.plot(profile.sizes, profile.imbalance[category].to_numpy(dtype=float), marker="o",
                  label=category, color=CATEGORY_COLOURS.get(category))
    axis.axhline(1.0, color="black", linestyle="--", linewidth=1, label="balanced")
    _world_size_axis(axis, profile.sizes)
    axis.set_ylim(bottom=0.9)  # the ratio is at least 1; keep the balanced line in view
    axis.set_ylabel("max over ranks / mean over ranks\nof the time per traced step")
    axis.set_title(_wrap(title), fontsize="medium")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return Figure(_save(figure, out_dir, f"kernel_imbalance_{series.slug}.png"), title)


def kernel_figures(series, profile, out_dir):
    return [category_time(series, profile, out_dir), category_fraction(series, profile, out_dir),
            comm_share(series, profile, out_dir), load_imbalance(series, profile, out_dir)]
