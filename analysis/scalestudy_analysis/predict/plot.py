"""prediction.png: step time and efficiency against N for strong and weak scaling, the
measured points, the held-out predictions, the intervals and the flagged points."""
from scalestudy_analysis.predict.flags import FLAG_GPU, FLAG_MEMORY


def _plot_check(axis, study, row, scale):
    """The held-out prediction of the largest N measured, fitted without it: a cross."""
    check = study.check
    if check is None:
        return
    table = study.series.table
    value = check["predicted_step_s"] * scale
    if row == 1:
        first = table["step_time_median_s"].iloc[0]
        value = first / check["predicted_step_s"]
        if study.series.scaling == "strong":
            value *= table["N"].iloc[0] / check["predicted_N"]
    axis.plot([check["predicted_N"]], [value], "x", color="black", markersize=7,
              label="held-out prediction" if study.series.index == 1 and row == 0 else None)


def _plot_flagged(axis, rows, key, scale, labelled):
    """Red crosses on the points beyond the GPU's memory; hollow red circles on those
    whose compute was measured on another GPU."""
    for column, marker, label, style in (
            ("exceeds_gpu_memory", "X", FLAG_MEMORY, {"color": "red"}),
            ("compute_on_other_gpu", "o", FLAG_GPU,
             {"markerfacecolor": "none", "markeredgecolor": "red"})):
        flagged = rows[rows[column].astype(bool)]
        if flagged.empty:
            continue
        axis.plot(flagged["N"], flagged[key] * scale, marker, linestyle="none", markersize=7,
                  label=None if label in labelled else label, **style)
        labelled.add(label)


def plot_predictions(path, studies, predictions, title):
    """Writes the PNG at `path`: predicted step time (ms) and efficiency against N, strong and
    weak, with shaded intervals and measured points as dots. Returns the flag labels drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(2, 2, figsize=(10, 6.4), sharex=True)
    labelled = set()
    for column, scaling in enumerate(("strong", "weak")):
        for index, study in enumerate(studies):
            colour = f"C{index}"
            rows = predictions[(predictions["strategy"] == study.label)
                               & (predictions["scaling"] == scaling)]
            for row, key, scale in ((0, "step_time_s", 1e3), (1, "efficiency", 1.0)):
                axis = axes[row][column]
                inside = rows[~(rows["beyond_measured_batch"] | rows["above_measured_batch"])]
                beyond = rows[rows["N"] >= inside["N"].max()] if len(inside) else rows
                axis.plot(inside["N"], inside[key] * scale, color=colour, label=study.label)
                axis.plot(beyond["N"], beyond[key] * scale, color=colour, linestyle="--")
                axis.fill_between(rows["N"], rows[f"{key}_lo"] * scale, rows[f"{key}_hi"] * scale,
                                  color=colour, alpha=0.2, linewidth=0)
                _plot_flagged(axis, rows, key, scale, labelled)
                if study.series.scaling == scaling:
                    table = study.series.table
                    y = (table["step_time_median_s"] * 1e3 if row == 0 else
                         table["step_time_median_s"].iloc[0] * table["N"].iloc[0]
                         / (table["N"] * table["step_time_median_s"]) if scaling == "strong"
                         else table["step_time_median_s"].iloc[0] / table["step_time_median_s"])
                    axis.plot(table["N"], y, "o", color=colour, markersize=5)
                    _plot_check(axis, study, row, scale)
        batch = (f"global batch {studies[0].global_batch:g}" if scaling == "strong"
                 else f"{studies[0].weak_batch:g} sequences per GPU")
        axes[0][column].set_title(f"{scaling} scaling, {batch}: step time (ms)",
                                  fontsize="medium")
        axes[1][column].set_title(f"{scaling} scaling, {batch}: efficiency", fontsize="medium")
        axes[1][column].set_xlabel("GPUs N; dots measured, dashed: micro-batch not measured")
        for row in range(2):
            axis = axes[row][column]
            axis.set_xscale("log", base=2)
            axis.set_xticks([1, 8, 64, 512, 4096])
            axis.set_xticklabels(["1", "8", "64", "512", "4096"])
            axis.grid(True, alpha=0.3)
        axes[0][column].set_yscale("log")
        axes[1][column].set_ylim(0, 1.1)
    for axis in axes[0]:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small")
    notes = sorted({s.gpu_note for s in studies if s.gpu_note and s.gpu_flag})
    figure.suptitle(title + ("\nflagged: " + "; ".join(notes) if notes else ""),
                    fontsize="medium", color="darkred" if notes else "black")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return labelled
