"""Where the scaling went: for each series and N above its N0, the median step T(N)
against the ideal step, T(N0)·N0/N for strong scaling and T(N0) for weak, and the
difference split over the breakdown's parts. A part's share is its median at N less its
median at N0 scaled as the ideal scales (·N0/N, or ·1), so the parts add up to
T(N) − ideal to within the breakdown's own closure (its medians' sum against the median
step, which the report checks to 1 %); the remainder is given as such. Shares are
fractions of T(N): a series whose efficiency is E loses 1 − E of its step in all."""
import numpy as np
import pandas as pd

from scalestudy_analysis.render.markdown import table
from scalestudy_analysis.render.figures import Figure, legend_outside, save_figure, wrap_title
from scalestudy_analysis.report.plots import BREAKDOWN_PARTS

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# What each part's growth means, as the table and the summary name it.
PART_LOSS_NAMES = {"compute": "compute growth", "optimizer": "optimizer",
                   "exposed_comm": "exposed communication", "data": "data", "other": "other"}


def ideal_factor(series, n):
    """The factor by which the ideal step at n scales T(N0): N0/n for strong scaling, 1 for
    weak."""
    return series.baseline_n / n if series.scaling == "strong" else 1.0


def scaling_loss(series):
    """One row per N above N0: step, ideal, loss (seconds and fraction of the step), each
    part's share (seconds and fraction) and what the parts leave unexplained."""
    indexed = series.table.set_index("N")
    n0 = series.baseline_n
    rows = []
    for n in indexed.index:
        if n == n0:
            continue
        factor = ideal_factor(series, n)
        step = float(indexed.loc[n, "step_time_median_s"])
        ideal = float(indexed.loc[n0, "step_time_median_s"]) * factor
        row = {"series": series.index, "strategy": series.strategy_label, "scaling": series.scaling,
               "N": int(n), "N0": n0, "step_s": step, "ideal_s": ideal, "loss_s": step - ideal,
               "loss_fraction": (step - ideal) / step}
        explained = 0.0
        for part, _, _ in BREAKDOWN_PARTS:
            column = f"breakdown_{part}_median_s"
            share = float(indexed.loc[n, column]) - float(indexed.loc[n0, column]) * factor
            row[f"{part}_s"], row[f"{part}_fraction"] = share, share / step
            explained += share
        row["unexplained_s"] = row["loss_s"] - explained
        row["unexplained_fraction"] = row["unexplained_s"] / step
        rows.append(row)
    return pd.DataFrame(rows)


def _percent(value):
    return "—" if not np.isfinite(value) else f"{100 * value:+.1f} %"


def loss_table(series_list):
    """The markdown table of every series' loss at every N above its N0."""
    header = (["series", "N", "step (ms)", "ideal (ms)", "lost, of the step"]
              + [PART_LOSS_NAMES[part] for part, _, _ in BREAKDOWN_PARTS] + ["unexplained"])
    lines = []
    for series in series_list:
        for _, row in scaling_loss(series).iterrows():
            lines.append([f"{series.index} ({series.strategy_label} {series.scaling})", str(row["N"]),
                          f"{row['step_s'] * 1e3:.2f}", f"{row['ideal_s'] * 1e3:.2f}", _percent(row["loss_fraction"])]
                         + [_percent(row[f"{part}_fraction"]) for part, _, _ in BREAKDOWN_PARTS]
                         + [_percent(row["unexplained_fraction"])])
    return table(header, lines) if lines else "No series measured more than one N."


def main_loss_sentence(series, n):
    """One sentence: what the series loses at N against its ideal, and to what, largest
    first; None where N is its N0."""
    losses = scaling_loss(series)
    if losses.empty or n not in set(losses["N"]):
        return None
    row = losses.set_index("N").loc[n]
    parts = sorted(((row[f"{part}_fraction"], PART_LOSS_NAMES[part]) for part, _, _ in BREAKDOWN_PARTS),
                   reverse=True)
    named = [f"{name} {100 * value:.1f} %" for value, name in parts if abs(value) >= 0.0005]
    ideal = "T(N0)·N0/N" if series.scaling == "strong" else "T(N0)"
    return (f"At N = {n}, {series.strategy_label} loses {100 * row['loss_fraction']:.1f} % of its step against "
            f"the ideal {ideal}: " + ", ".join(named) + ".")


def loss_figures(series_list, out_dir):
    """Per scaling mode, one stacked bar per series and N: each part's share of the step,
    gains below zero, so that the small parts show beside the large."""
    figures = []
    for scaling in ("strong", "weak"):
        rows = [(series, row) for series in series_list if series.scaling == scaling
                for _, row in scaling_loss(series).iterrows()]
        if not rows:
            continue
        title = (f"{scaling.capitalize()} scaling: where the step exceeds the ideal, as % of the step "
                 "(parts of the breakdown; below zero, parts that shrank more than the ideal)")
        figure, axis = plt.subplots(figsize=(9, 4.5))
        positions = np.arange(len(rows))
        up, down = np.zeros(len(rows)), np.zeros(len(rows))
        for part, name, colour in BREAKDOWN_PARTS:
            values = np.array([100 * row[f"{part}_fraction"] for _, row in rows])
            base = np.where(values >= 0, up, down)
            axis.bar(positions, values, bottom=base, color=colour, width=0.6, label=PART_LOSS_NAMES[part])
            up += np.clip(values, 0, None)
            down += np.clip(values, None, 0)
        axis.scatter(positions, [100 * row["loss_fraction"] for _, row in rows], marker="_", s=900,
                     color="black", zorder=3, label="lost in all (1 − efficiency)")
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xticks(positions)
        axis.set_xticklabels([f"{series.strategy_label}\nN = {row['N']}" for series, row in rows], fontsize="small")
        axis.set_ylabel("% of the step at N")
        axis.set_title(wrap_title(title), fontsize="medium")
        axis.grid(True, axis="y", alpha=0.3)
        legend_outside(axis)
        figures.append(Figure(save_figure(figure, out_dir, f"{scaling}_scaling_loss.png"), title))
    return figures
