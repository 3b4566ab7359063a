"""The report's "Kernel profile" section, present when any usable run carries
/kernel_trace: per series the categories against N with four figures, and per world size
one run's tracing overhead, time per category of every rank and each rank's top kernels.
kernel_top.csv and kernel_categories.csv hold the same for every rank of every run."""
import numpy as np
import pandas as pd

from .kernel_plots import kernel_figures
from .kernels import TOP_KERNELS, category_times, profiled_runs, series_profile, top_kernels
from .markdown import figure_markdown, fmt, percent, relative, table
from .schema import KERNEL_CATEGORY_NAMES
from .timeline import ranks_to_show

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
