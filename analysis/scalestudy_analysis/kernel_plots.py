"""Figures of a series' kernel profile against world size: time and fraction per category
(stacked bars), the communication share and the load imbalance (lines)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from .plots import Figure, _save, _world_size_axis, _wrap  # noqa: E402
from .schema import COMMUNICATION_CATEGORY  # noqa: E402

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
