"""Scaling figures as PNG files. Each function returns a Figure entry for the report:
the file written (None when skipped) and a note saying why when it was skipped. The
helpers every figure shares are render/figures.py's."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

from scalestudy_analysis.render.figures import Figure, legend_outside, save_figure, world_size_axis, wrap_title  # noqa: E402
from scalestudy_analysis.results.metrics import legend_labels  # noqa: E402

BREAKDOWN_PARTS = (("compute", "compute (forward+backward)", "#4C72B0"),
                   ("optimizer", "optimizer", "#55A868"),
                   ("exposed_comm", "exposed communication", "#DD8452"),
                   ("data", "data", "#8C8C8C"),
                   ("other", "other (waits, host gaps)", "#D0D0D0"))


def _line_plot(series_list, out_dir, name, title, column, ylabel, ideal=None, band=None,
               log_y_base=None, ideal_in_series_colour=False, y_from_zero=False, figsize=(9, 4.5)):
    """Lines of one column against N, an optional IQR band, and a dashed ideal
    (ideal(series) gives its y values at the series' N; identical ideals are drawn once)."""
    figure, axis = plt.subplots(figsize=figsize)
    sizes = []
    drawn = set()
    for series, label in zip(series_list, legend_labels(series_list)):
        table = series.table
        line, = axis.plot(table["N"], table[column].to_numpy(dtype=float), marker="o",
                          label=label)
        sizes.extend(table["N"])
        if band is not None:
            low, high = (table[c].to_numpy(dtype=float) for c in band)
            axis.fill_between(table["N"], low, high, color=line.get_color(), alpha=0.2,
                              linewidth=0)
        if ideal is None:
            continue
        ideal_y = np.asarray(ideal(series), dtype=float)
        key = (tuple(table["N"]), tuple(np.round(ideal_y, 12)))
        if key in drawn and not ideal_in_series_colour:
            continue
        colour = line.get_color() if ideal_in_series_colour else "black"
        axis.plot(table["N"], ideal_y, linestyle="--", color=colour, linewidth=1,
                  label=None if drawn else
                  ("ideal: linear from N0" if ideal_in_series_colour else "ideal"))
        drawn.add(key)
    world_size_axis(axis, sizes)
    if log_y_base:
        axis.set_yscale("log", base=log_y_base)
        axis.yaxis.set_major_formatter(ScalarFormatter())
    if y_from_zero:
        axis.set_ylim(bottom=0)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    legend_outside(axis)
    return Figure(save_figure(figure, out_dir, name), title)


def _skip(title, why):
    return Figure(None, title, why)


def _scaling_plot(series_list, out_dir, scaling, name, title, column, ylabel, **options):
    """A line plot of the series of one scaling mode, or a skip note when there are none."""
    of_mode = [s for s in series_list if s.scaling == scaling]
    if not of_mode:
        return _skip(title, f"no {scaling}-scaling series")
    return _line_plot(of_mode, out_dir, name, title, column, ylabel, **options)


def strong_speedup(series_list, out_dir):
    """Figure: strong scaling's speedup T(N0)/T(N) against N, with the ideal N/N0 and the
    interquartile band; writes strong_speedup.png."""
    return _scaling_plot(series_list, out_dir, "strong", "strong_speedup.png",
                         "Strong scaling: speedup over the smallest N", "speedup",
                         "speedup S(N) = T(N0) / T(N)",
                         ideal=lambda s: s.table["N"] / s.baseline_n,
                         band=("speedup_q1", "speedup_q3"), log_y_base=2)


def strong_efficiency(series_list, out_dir):
    """Figure: strong scaling's parallel efficiency S(N)·N0/N against N, ideal 1, with the
    interquartile band; writes strong_efficiency.png."""
    return _scaling_plot(series_list, out_dir, "strong", "strong_efficiency.png",
                         "Strong scaling: parallel efficiency", "efficiency",
                         "efficiency S(N) · N0 / N", ideal=lambda s: np.ones(len(s.table)),
                         band=("efficiency_q1", "efficiency_q3"))


def weak_efficiency(series_list, out_dir):
    """Figure: weak scaling's efficiency (tokens/s per rank relative to N0) against N, ideal 1,
    with the interquartile band; writes weak_efficiency.png."""
    return _scaling_plot(series_list, out_dir, "weak", "weak_efficiency.png",
                         "Weak scaling: efficiency (tokens/s per rank relative to N0)",
                         "efficiency", "weak efficiency", ideal=lambda s: np.ones(len(s.table)),
                         band=("efficiency_q1", "efficiency_q3"))


def tokens_per_second(series_list, out_dir):
    """Figure: throughput (tokens/s) against N with each series' ideal linear growth from N0;
    writes tokens_per_s.png, or is skipped without series."""
    title = "Throughput against world size"
    if not series_list:
        return _skip(title, "no series")
    return _line_plot(series_list, out_dir, "tokens_per_s.png", title, "tokens_per_s",
                      "throughput (tokens/s)", band=("tokens_per_s_q1", "tokens_per_s_q3"),
                      ideal=lambda s: s.table["tokens_per_s"].iloc[0] * s.table["N"]
                      / s.baseline_n, log_y_base=10, ideal_in_series_colour=True)


def mfu(series_list, out_dir):
    """Figure: model FLOPs utilisation against N for the series with a peak FLOP rate; writes
    mfu.png, or is skipped when none has one (CPU runs record none)."""
    title = "Model FLOPs utilisation against world size"
    with_peak = [s for s in series_list if np.isfinite(s.table["mfu"]).any()]
    if not with_peak:
        return _skip(title, "no run has a peak FLOP rate (CPU runs record none), so MFU "
                     "is undefined")
    return _line_plot(with_peak, out_dir, "mfu.png", title, "mfu",
                      "MFU (model TFLOP/s per GPU / peak)", y_from_zero=True)


def comm_fraction(series_list, out_dir):
    """Figure: median communication time, all and exposed, over the median step against N;
    writes comm_fraction.png, or is skipped without series."""
    title = "Communication time as a fraction of step time"
    if not series_list:
        return _skip(title, "no series")
    figure, axis = plt.subplots(figsize=(9, 4.5))
    sizes = []
    for series, label in zip(series_list, legend_labels(series_list)):
        table = series.table
        line, = axis.plot(table["N"], table["comm_fraction_of_step"], marker="o",
                          label=f"{label}: all comm")
        axis.plot(table["N"], table["exposed_fraction_of_step"], marker="x", linestyle="--",
                  color=line.get_color(), label=f"{label}: exposed comm")
        sizes.extend(table["N"])
    world_size_axis(axis, sizes)
    axis.set_ylabel("median comm time / median step time")
    axis.set_ylim(bottom=0)
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    legend_outside(axis)
    return Figure(save_figure(figure, out_dir, "comm_fraction.png"), title)


def breakdown(series, out_dir):
    """Stacked median per-step parts on the critical (slowest) rank, one bar per N, each
    part with its interquartile range drawn on its own segment; a tick marks the median
    step, which the parts add up to."""
    title = f"Step time breakdown: {series.label}"
    table = series.table
    figure, axis = plt.subplots(figsize=(8, 4.5))
    positions = np.arange(len(table))
    bottom = np.zeros(len(table))
    offsets = np.linspace(-0.2, 0.2, len(BREAKDOWN_PARTS))
    for (part, name, colour), offset in zip(BREAKDOWN_PARTS, offsets):
        median, q1, q3 = (table[f"breakdown_{part}_{q}_s"].to_numpy(dtype=float) * 1e3
                          for q in ("median", "q1", "q3"))
        axis.bar(positions, median, bottom=bottom, label=name, color=colour, width=0.6)
        axis.errorbar(positions + offset, bottom + median, yerr=[median - q1, q3 - median],
                      fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
        bottom += median
    step = table["step_time_median_s"].to_numpy(dtype=float) * 1e3
    axis.scatter(positions, step, marker="_", s=900, color="black", zorder=3,
                 label="median step")
    axis.set_xticks(positions)
    # Under each bar, whether its communication crossed nodes (metrics.comm_part_name).
    scopes = table["comm_scope"] if "comm_scope" in table else ["—"] * len(table)
    axis.set_xticklabels([str(int(n)) + ("" if scope == "—" else f"\n{scope}")
                          for n, scope in zip(table["N"], scopes)])
    axis.set_xlabel("world size N (ranks); communication intra- or inter-node")
    axis.set_ylabel("median time per step (ms), IQR whiskers")
    axis.set_ylim(bottom=0)
    axis.set_title(wrap_title(title), fontsize="medium")
    legend_outside(axis)
    axis.grid(True, axis="y", alpha=0.3)
    return Figure(save_figure(figure, out_dir, f"breakdown_{series.slug}.png"), title)


def common_efficiency(series_list, out_dir, baselines):
    """Per scaling mode, every series' efficiency against its common baseline series: the
    report's headline figure, sized to share the first screen with the summary table."""
    figures = []
    for scaling in ("strong", "weak"):
        with_base = [s for s in series_list if s.scaling == scaling and s.index in baselines]
        if not with_base:
            continue
        named = sorted({f"{b.index} ({b.strategy_label}) at N={b.baseline_n}"
                        for s in with_base for b in [baselines[s.index]]})
        title = f"{scaling.capitalize()} scaling: efficiency against series {', '.join(named)}"
        figures.append(_line_plot(with_base, out_dir, f"{scaling}_efficiency_common.png",
                                  wrap_title(title), "efficiency_common",
                                  "throughput · N0 / (N · baseline throughput at N0)",
                                  ideal=lambda s: np.ones(len(s.table)),
                                  band=("efficiency_common_q1", "efficiency_common_q3"),
                                  figsize=(8, 3.4)))
        figures[-1].title = title
    return figures


def overview_figures(series_list, out_dir):
    """The overview figures in the report's order: strong speedup and efficiency, weak
    efficiency, throughput, communication fraction, MFU."""
    return [strong_speedup(series_list, out_dir), strong_efficiency(series_list, out_dir),
            weak_efficiency(series_list, out_dir), tokens_per_second(series_list, out_dir),
            comm_fraction(series_list, out_dir), mfu(series_list, out_dir)]
