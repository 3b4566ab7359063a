"""Timeline of one measured step: every rank gets a compute lane (phases from
/steps/intervals) and a comm lane (collectives from /collectives)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from scalestudy_analysis.render.figures import DPI, Figure, ranks_to_show, wrap_title  # noqa: E402
from scalestudy_analysis.results.schema import COLLECTIVE_NAMES, PHASE  # noqa: E402

PHASE_COLOURS = {"data": "#8C8C8C", "forward": "#4C72B0", "backward": "#8172B3",
                 "optimizer": "#55A868"}
COLLECTIVE_COLOURS = {"allreduce": "#DD8452", "reduce_scatter": "#C44E52",
                      "allgather": "#DA8BC3", "broadcast": "#937860", "barrier": "#CCB974"}


def median_step_row(run):
    """Row of the measured step whose step time is the median (the lower middle one for
    an even count), so the picture shows a typical step, not an outlier."""
    rows = np.flatnonzero(run.measured)
    times = run.quantities.step_time[rows]
    order = np.argsort(times, kind="stable")
    return int(rows[order[(len(order) - 1) // 2]])


def timeline_run(series):
    """The run drawn for a series: largest N, lowest repeat."""
    def order(run):
        try:
            repeat = int(run.repeat)
        except ValueError:
            repeat = 0
        return (-run.world_size, repeat, run.path)
    return sorted(series.runs, key=order)[0]


def plot_timeline(run, out_path, title):
    """Writes a PNG at out_path of the run's median measured step: each shown rank's phases and
    collectives in ms from the step's start. Returns that step's index."""
    row = median_step_row(run)
    intervals = run.intervals[row]
    pieces = run.quantities.pieces
    critical = int(run.quantities.critical_rank[row])
    ranks = ranks_to_show(run.world_size, critical)
    # The two lanes of a rank sit close together; ranks are set apart by a wider gap.
    lane_height, lane_gap, rank_gap = 0.8, 0.1, 0.7
    figure, axis = plt.subplots(figsize=(10, 1.5 + 0.8 * len(ranks)))
    ticks, tick_labels = [], []
    for position, rank in enumerate(ranks):
        compute_y = position * (2 * lane_height + lane_gap + rank_gap)
        comm_y = compute_y + lane_height + lane_gap
        for phase, colour in PHASE_COLOURS.items():
            begin, end = intervals[rank, PHASE[phase]]
            if np.isfinite(begin) and np.isfinite(end) and end > begin:
                axis.broken_barh([(begin * 1e3, (end - begin) * 1e3)], (compute_y, lane_height),
                                 facecolors=colour, edgecolor="white", linewidth=0.5)
        mine = (pieces.row == row) & (pieces.rank == rank)
        # One call per colour and hatch: thousands of single bars make matplotlib crawl.
        for kind in np.unique(pieces.kind[mine]):
            name = COLLECTIVE_NAMES[kind] if 0 <= kind < len(COLLECTIVE_NAMES) else "barrier"
            for carried in (False, True):
                chosen = mine & (pieces.kind == kind) & (pieces.carried == carried)
                if not chosen.any():
                    continue
                spans = list(zip(pieces.begin[chosen] * 1e3,
                                 (pieces.end[chosen] - pieces.begin[chosen]) * 1e3))
                axis.broken_barh(spans, (comm_y, lane_height),
                                 facecolors=COLLECTIVE_COLOURS[name], edgecolor="black",
                                 linewidth=0.3, hatch="//" if carried else None)
        step_end = intervals[rank, PHASE["step"], 1] * 1e3
        axis.plot([step_end, step_end], [compute_y, comm_y + lane_height], color="black",
                  linewidth=1)
        marker = " (slowest)" if rank == critical else ""
        ticks += [compute_y + lane_height / 2, comm_y + lane_height / 2]
        tick_labels += [f"rank {rank}{marker} compute", f"rank {rank} comm"]
    axis.set_yticks(ticks)
    axis.set_yticklabels(tick_labels, fontsize="small")
    axis.invert_yaxis()
    axis.set_xlabel("time since the start of the step (ms)")
    shown = "" if len(ranks) == run.world_size else f", {len(ranks)} of {run.world_size} ranks"
    step = int(run.step_index[row])
    axis.set_title(wrap_title(f"{title}: step {step} (median of the measured steps), "
                         f"N={run.world_size}{shown}", 90), fontsize="medium")
    kinds = sorted(set(int(k) for k in pieces.kind[pieces.row == row]))
    handles = [Patch(color=colour, label=phase) for phase, colour in PHASE_COLOURS.items()]
    handles += [Patch(color=COLLECTIVE_COLOURS[COLLECTIVE_NAMES[k]], label=COLLECTIVE_NAMES[k])
                for k in kinds if 0 <= k < len(COLLECTIVE_NAMES)]
    if pieces.carried[pieces.row == row].any():
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label="started in the previous step"))
    handles.append(plt.Line2D([], [], color="black", label="end of step"))
    axis.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    axis.grid(True, axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out_path, dpi=DPI)
    plt.close(figure)
    return step


def timeline(series, out_dir):
    """Figure: the timeline of the series' drawn run (largest N, lowest repeat); writes
    timeline_<slug>.png under out_dir."""
    run = timeline_run(series)
    name = f"timeline_{series.slug}.png"
    step = plot_timeline(run, out_dir / name, series.label)
    return Figure(name, f"Timeline of step {step}, N={run.world_size}: {series.label}",
                  f"from {run.path}")
