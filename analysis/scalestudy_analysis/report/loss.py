"""Loss against step per N, with the 1-rank curve: with a fixed global batch every
strategy computes the same training (DESIGN.md, invariant 1), so under strong scaling the
curves must overlap, and how far one departs is measured."""
import math
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from scalestudy_analysis.results.baseline import comparable_key  # noqa: E402
from scalestudy_analysis.render.figures import Figure, legend_outside, save_figure, wrap_title  # noqa: E402

# A strong-scaling curve further than this from the 1-rank one (relative, at any step) is
# listed under Warnings. Reduction order alone moves a bf16 loss by some 1e-5 over tens
# of steps (the example sweep); a strategy that trains something else moves it by more.
LOSS_DEPARTURE_WARNING = 0.01


def loss_curve(runs):
    """(step_index, median loss over the runs at each step) over the steps all runs have."""
    if not runs:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    common = sorted(set.intersection(*(set(run.step_index.tolist()) for run in runs)))
    values = []
    for run in runs:
        position = {step: row for row, step in enumerate(run.step_index.tolist())}
        values.append([run.loss[position[step]] for step in common])
    return np.array(common, dtype=np.int64), np.median(np.array(values, dtype=np.float64), axis=0)


def one_rank_runs(series, series_list):
    """The 1-rank runs to draw beside a series: its own, or, under strong scaling, those
    of a comparable series (same model, sequence and global batch), which train the same
    model on the same data. (runs, the series they come from) or ([], None)."""
    own = [run for run in series.runs if run.world_size == 1]
    if own:
        return own, series
    if series.scaling != "strong":
        return [], None
    for other in series_list:
        if comparable_key(other) == comparable_key(series):
            runs = [run for run in other.runs if run.world_size == 1]
            if runs:
                return runs, other
    return [], None


def departure(curve, reference):
    """Largest relative difference between two loss curves over their common steps."""
    steps, values = curve
    ref_steps, ref_values = reference
    common, mine, theirs = np.intersect1d(steps, ref_steps, return_indices=True)
    if common.size == 0:
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.abs(values[mine] - ref_values[theirs]) / np.abs(ref_values[theirs])
    relative = relative[np.isfinite(relative)]
    return float(relative.max()) if relative.size else math.nan


def loss_figure(series, series_list, out_dir):
    """The figure and {N: departure from the 1-rank curve} of one series."""
    by_n = defaultdict(list)
    for run in series.runs:
        by_n[run.world_size].append(run)
    reference_runs, source = one_rank_runs(series, series_list)
    reference = loss_curve(reference_runs)
    title = f"Loss against step: {series.label}"
    figure, axis = plt.subplots(figsize=(8, 4.5))
    if reference_runs:
        label = "1 rank" + ("" if source is series else f" (series {source.index})")
        axis.plot(*reference, color="black", linewidth=3, alpha=0.35, label=label)
    departures = {}
    for n in sorted(by_n):
        curve = loss_curve(by_n[n])
        axis.plot(*curve, marker=".", linewidth=1, label=f"N = {n}")
        if reference_runs:
            departures[n] = departure(curve, reference)
    axis.set_xlabel("step")
    axis.set_ylabel("loss (median over repeats)")
    axis.set_title(wrap_title(title), fontsize="medium")
    axis.grid(True, alpha=0.3)
    legend_outside(axis)
    note = ("" if reference_runs else "no 1-rank run to draw beside it")
    return Figure(save_figure(figure, out_dir, f"loss_{series.slug}.png"), title, note), departures


def departure_line(series, departures):
    """One sentence giving the largest relative departure of the loss from the 1-rank run at
    each N ({N: departure}), worded for the scaling mode; "" when there is none."""
    if not departures:
        return ""
    shown = ", ".join(f"N = {n}: {value:.2e}" for n, value in sorted(departures.items()))
    if series.scaling == "strong":
        return ("Largest relative departure of the loss from the 1-rank run (the same "
                f"training, so it should be rounding alone): {shown}.")
    return ("Largest relative departure of the loss from the 1-rank run (weak scaling: the "
            f"global batch grows with N, so the curves need not overlap): {shown}.")
