"""Warnings: what makes a figure of the report doubtful although every file was sound.
Oversubscribed hosts, noisy or few measurements, superlinear efficiency, a breakdown
whose medians do not add up, a loss that leaves the 1-rank run, dirty builds; and what a
study on the CPU backend can and cannot show."""
import math
from dataclasses import dataclass

import numpy as np

from scalestudy_analysis.results import machine
from scalestudy_analysis.report.loss import LOSS_DEPARTURE_WARNING
from scalestudy_analysis.render.markdown import table
from scalestudy_analysis.results.metrics import series_peak

# An IQR wider than this share of the median step makes differences of that size noise.
IQR_WARNING = 0.05
# Efficiency above 1 + this is superlinear: caches, a noisy baseline or oversubscription
# at N0 rather than scaling; a couple of percent is within run-to-run noise.
EFFICIENCY_WARNING = 1.02
# Fewer repeats than this give no idea of run-to-run variation.
MIN_REPEATS = 3
# The breakdown's medians may miss the median step by this much (DESIGN.md invariant 6).
BREAKDOWN_SUM_WARNING = 0.01
# Measured peaks that spread more than this make a CPU MFU a statement about the peak.
PEAK_SPREAD_WARNING = 0.05


@dataclass(frozen=True)
class Flag:
    """One warning of the report: its kind, the series (and N) it concerns, the message of
    its kind and the number behind it there."""
    kind: str
    where: str        # the series (and N) it concerns
    message: str      # what it means, the same for every place of the kind
    detail: str = ""  # the number behind it at this place


def _where(series, n=None):
    return f"series {series.index} ({series.strategy_label} {series.scaling})" + (
        f" N = {n}" if n is not None else "")


def _is_cpu(run):
    return str(run.attrs.get("backend")) == "cpu"


def _host_flags(run, where):
    """Oversubscription, binding and shared cores of one run whose cores are known."""
    found = []
    over = machine.oversubscribed_hosts(run)
    for host, ranks, cores in over:
        found.append(Flag("oversubscribed", where, "more ranks than logical cores: ranks "
                          "share cores, and the timings measure the sharing",
                          f"{ranks} ranks on `{host}`, {cores} cores"))
    if _is_cpu(run) and not over:
        for host, ranks, cores in machine.oversubscribed_hosts(run, machine.CPU_THREADS_PER_RANK):
            found.append(Flag("oversubscribed threads", where, "each rank of the CPU backend "
                              "runs its collectives on a worker thread beside its compute "
                              "thread, so with more threads than logical cores communication "
                              "that overlaps compute takes a core from it",
                              f"{ranks} ranks on `{host}`, {cores} cores"))
    unbound = machine.unbound_ranks(run) or []
    if run.world_size > 1 and _is_cpu(run) and unbound:
        found.append(Flag("unbound", where, "ranks not bound to cores: the scheduler moves "
                          "them, which adds noise", f"{len(unbound)} of {run.world_size}"))
    shared = machine.shared_bindings(run) or []
    if shared:
        found.append(Flag("shared cores", where, "ranks bound to the same cores share them",
                          f"{len(shared)} cores on {', '.join(sorted({h for h, _ in shared}))}"))
    return found


def _oversubscription(series):
    found, unknown = [], 0
    for run in series.runs:
        if machine.host_cores(run):
            found += _host_flags(run, _where(series, run.world_size))
        elif _is_cpu(run):
            unknown += 1
    if unknown:
        found.append(Flag("cores unknown", _where(series), "CPU runs whose files (before schema "
                          "version 5) do not record the host's logical cores: "
                          "oversubscription cannot be checked", f"{unknown} runs"))
    seen = {}
    for flag in found:  # one flag per kind and place, whatever the runs behind it
        seen.setdefault((flag.kind, flag.where), flag)
    return list(seen.values())


def _point_warnings(series):
    found = []
    for _, point in series.table.iterrows():
        where = _where(series, int(point["N"]))
        iqr = (point["step_time_q3_s"] - point["step_time_q1_s"]) / point["step_time_median_s"]
        if iqr > IQR_WARNING:
            found.append(Flag("noisy", where, f"the step time's IQR exceeds {IQR_WARNING:.0%} of "
                              "its median: differences smaller than that are noise",
                              f"{100 * iqr:.1f} %"))
        for column, what in (("efficiency", "efficiency"),
                             ("efficiency_common", "efficiency against the baseline")):
            value = point.get(column, math.nan)
            if np.isfinite(value) and value > EFFICIENCY_WARNING:
                found.append(Flag("superlinear", where, f"{what} exceeds {EFFICIENCY_WARNING}: "
                                  "look for a noisy or oversubscribed baseline before "
                                  "believing it", f"{value:.3f}"))
        if point["repeats"] < MIN_REPEATS:
            found.append(Flag("few repeats", where, f"fewer than {MIN_REPEATS} repeats: "
                              "run-to-run variation is unknown", f"{int(point['repeats'])}"))
        if abs(point["breakdown_sum_error"]) > BREAKDOWN_SUM_WARNING:
            found.append(Flag("breakdown", where, "the medians of the breakdown's parts miss "
                              f"the median step by more than {BREAKDOWN_SUM_WARNING:.0%}: the "
                              "steps differ in their make-up, so read the parts as typical, "
                              "not as a sum", f"{100 * point['breakdown_sum_error']:+.1f} %"))
    return found


def _loss_warnings(series, departures):
    if series.scaling != "strong":
        return []
    return [Flag("loss departs", _where(series, n), "the loss departs from the 1-rank run by "
                 f"more than {LOSS_DEPARTURE_WARNING:.0%}: with one global batch every "
                 "strategy should train the same", f"{100 * value:.2f} %")
            for n, value in sorted(departures.items()) if value > LOSS_DEPARTURE_WARNING]


def _build_warnings(series_list):
    dirty = sorted({machine.build(run) for s in series_list for run in s.runs
                    if machine.is_dirty(run)})
    return [Flag("dirty build", f"`{build}`", "built from a tree with local changes: the "
                 "commit alone does not say what ran, and two dirty runs of one commit may "
                 "differ") for build in dirty]


def _peak_warnings(series):
    median, low, high = series_peak(series.runs)
    if not np.isfinite(median) or median == 0 or (high - low) / median <= PEAK_SPREAD_WARNING:
        return []
    return [Flag("peak varies", _where(series), "the runs' measured peak FLOP rates spread by "
                 f"more than {PEAK_SPREAD_WARNING:.0%}; MFU divides by their median",
                 f"{low:.3g} to {high:.3g} TFLOP/s, median {median:.3g}")]


def collect(series_list, details):
    """Every Flag of the report: each series' oversubscription, point, loss and peak warnings,
    then the build warnings; details: SeriesDetails by series index."""
    found = []
    for series in series_list:
        found += _oversubscription(series)
        found += _point_warnings(series)
        found += _loss_warnings(series, details[series.index].loss_departure)
        found += _peak_warnings(series)
    return found + _build_warnings(series_list)


# What a reader can do about each kind of warning.
WHAT_TO_DO = {
    "oversubscribed": "run fewer ranks per node, or spread them over more nodes",
    "oversubscribed threads": "leave a core per rank for its communication thread (fewer ranks per node)",
    "unbound": "bind ranks to cores (mpirun --bind-to core, srun --cpu-bind=cores)",
    "shared cores": "give each rank cores of its own",
    "cores unknown": "rerun with a build that records the host's cores",
    "noisy": "run on an exclusive node, with more steps or repeats",
    "superlinear": "check the baseline run for noise or oversubscription, and repeat it",
    "few repeats": "raise repeats in the experiment file",
    "breakdown": "read the parts as typical steps; look for outlier steps in the timeline",
    "loss departs": "check that the strategy trains as one rank does (the equivalence tests)",
    "dirty build": "rebuild from a committed tree before runs that are to be compared",
    "peak varies": "compare MFU within one host, or give the peak rate",
}


def warnings_section(flags):
    """A table of one row per kind and meaning: where it holds (with each place's number),
    what it means and what to do."""
    if not flags:
        return ("None: no host had more ranks than cores (where recorded), every step time's "
                f"IQR is within {IQR_WARNING:.0%} of its median, no efficiency exceeds "
                f"{EFFICIENCY_WARNING}, every point has at least {MIN_REPEATS} repeats, and "
                "every breakdown adds up.")
    grouped = {}
    for flag in flags:
        grouped.setdefault((flag.kind, flag.message), []).append(
            flag.where + (f" ({flag.detail})" if flag.detail else ""))
    return table(["kind", "where", "what it means", "what to do"],
                 [[f"**{kind}**", "; ".join(places), message, WHAT_TO_DO.get(kind, "—")]
                  for (kind, message), places in grouped.items()])


CPU_STUDY = """\
Some series ran on the CPU backend. What such a study shows, and what it does not:

- **It shows the method**: the sweep, the files, the report and every definition in it
  work as they do on GPUs.
- **It shows the equivalence**: with a fixed global batch every strategy and every N
  trains the same model, so the loss curves lie on the 1-rank curve (the CPU backend
  is the reference the GPU backend is checked against).
- **It shows the strategies' overheads in kind**: the extra collectives of zero2, what
  overlap hides, and zero2's memory saving per rank.
- **It does not show GPU figures**: throughput, MFU, communication fractions and
  bandwidths depend on the device and the interconnect. On the CPU, MPI collectives
  run over shared memory on a worker thread that competes with compute for the same
  cores, so the balance of compute and communication, and what overlap gains, are not
  a GPU's.
- **MFU on the CPU** divides by a peak each run measures (a small fp32 matmul, best of a
  few), which varies from run to run; the report uses the median of the series' runs
  and names their spread, so MFU compares points of one series, not machines.
- **Timings are trustworthy only** when the host has at least as many cores as ranks
  and nothing else runs: see Warnings."""


def has_cpu_series(series_list):
    """Whether any run of any series ran on the CPU backend."""
    return any(str(run.attrs.get("backend")) == "cpu" for s in series_list for run in s.runs)
