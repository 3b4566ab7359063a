"""The report's "GPU state" section over the measured steps of a set of runs, from the
figures results/gpu_state.py reads and computes: its tables per series and N, per step and
by phase, and gpu_state.csv and gpu_state_by_phase.csv."""
from collections import defaultdict

import pandas as pd

from scalestudy_analysis.render.markdown import fmt, percent, relative, table
from scalestudy_analysis.results.gpu_state import (gpu_metrics, gpu_phase_metrics, has_phase_samples, has_samples,
                                                   phases_with_samples, rank_phase_rows, reason_names)

GPU_STATE_DEFINITIONS = """\
- Source: `/steps/gpu_*` (schema version 3): each rank samples its GPU through NVML every
  `gpu_telemetry_ms` ms, and the file holds per step and rank the samples' count, mean and
  lowest SM clock, mean board power, highest temperature, the fraction at the software
  power cap and the clock event reasons seen. The steps are those of the timing tables:
  warm-up and traced steps are left out. Runs without samples (CPU backend,
  `--gpu-telemetry-ms 0`, no NVML, files older than version 3) are left out here.
- **SM clock, slowest rank**: per step the lowest of the ranks' mean SM clocks, as a
  data-parallel step waits for its slowest GPU; the median over the steps of all runs at
  one N. **All ranks**: the median over every step and rank. **Lowest**: the lowest sample.
- **Power**: median over every step and rank of the mean board power (NVML's
  instantaneous reading). **Highest temperature**: the highest sample.
- **Power-capped**: the share of the samples whose clock event reasons include the
  software power cap (each step and rank weighted by its sample count).
- **Clock event reasons**: every reason any sample gave (NVML's bits, OR over everything)."""

GPU_PHASE_DEFINITIONS = """\
- **By phase**: `/steps/gpu_phase_*` (schema version 4) holds the same samples per step,
  rank and phase, each counted in every phase whose interval on its rank held it: a
  phase's figures are the GPU's state while that phase ran, whatever ran beside it
  (grad-comm beside backward). Shown for forward, backward, grad-comm, optimizer and
  param-gather, each where some run has a sample in it; data (mostly the host's wait for
  tokens) and step (the whole step, as above) are not. The steps are the measured steps
  again, and a step counts for a phase on a rank only where the phase held a sample there.
- **Phase SM clock, slowest rank**: per run and rank, the median over those steps of the
  phase's mean SM clock; the lowest of the ranks' medians (a rank without a sample in the
  phase is skipped); the median of that over the runs at one N (one run: its value).
  Medians over steps, not per-step minima, since a phase shorter than the sampling period
  holds a sample in some steps only.
- **Phase power**: the median over every such step and rank of all runs at one N of the
  phase's mean board power.
- `gpu_state_by_phase.csv`: per run, rank and phase (all seven) with samples in the
  measured steps, the samples, the steps holding one and the medians of both."""


def _gpu_state_row(metrics):
    return [fmt(metrics["samples"]), fmt(metrics["sm_clock_slowest_rank_median_mhz"]),
            fmt(metrics["sm_clock_median_mhz"]), fmt(metrics["sm_clock_lowest_mhz"]),
            fmt(metrics["power_median_w"]), fmt(metrics["temperature_highest_c"]),
            percent(metrics["power_capped_fraction"]),
            ", ".join(reason_names(metrics["clock_event_reasons"])) or "none"]


def _gpu_state_csv_rows(series, sampled, results_dir):
    rows = []
    for run in sampled:
        metrics = gpu_metrics([run])
        rows.append({"series": series.index, "path": relative(run.path, results_dir),
                     "N": run.world_size, "repeat": run.repeat,
                     "gpu_telemetry_ms": run.config.get("gpu_telemetry_ms", ""), **metrics,
                     "clock_event_reasons": f"{metrics['clock_event_reasons']:#x}",
                     "clock_event_reason_names": "; ".join(
                         reason_names(metrics["clock_event_reasons"]))})
    return rows


def _gpu_phase_table(by_n, phases):
    """The table by phase of one series, one row per N with runs that have samples by
    phase; None when none has."""
    header = ["N", "runs"] + [f"{phase}: {quantity}" for phase in phases
                              for quantity in ("SM clock, slowest rank (MHz)", "power (W)")]
    rows = []
    for n in sorted(by_n):
        phased = [run for run in by_n[n] if has_phase_samples(run)]
        if not phased:
            continue
        row = [str(n), str(len(phased))]
        for phase in phases:
            metrics = gpu_phase_metrics(phased, phase)
            row += [fmt(metrics["sm_clock_slowest_rank_median_mhz"]),
                    fmt(metrics["power_median_w"])]
        rows.append(row)
    return table(header, rows) if rows else None


def _gpu_phase_csv_rows(series, runs, results_dir):
    return [{"series": series.index, "path": relative(run.path, results_dir),
             "N": run.world_size, "repeat": run.repeat,
             "gpu_telemetry_ms": run.config.get("gpu_telemetry_ms", ""), **row}
            for run in runs if has_phase_samples(run) for row in rank_phase_rows(run)]


def gpu_state_section(series_list, runs, out_dir, results_dir):
    """The "GPU state" section; writes gpu_state.csv (one row per run with samples) when
    any run used has samples, and gpu_state_by_phase.csv (one row per run, rank and phase
    with samples) when any of those has samples by phase."""
    used = [run for run in runs if run.usable]
    sampled = [run for run in used if has_samples(run)]
    parts = ["## GPU state", ""]
    if not sampled:
        return "\n".join(parts + ["No run used has GPU samples (CPU backend, "
                                   "`--gpu-telemetry-ms 0`, no NVML, or files older than "
                                   "schema version 3)."])
    phased = [run for run in sampled if has_phase_samples(run)]
    phases = phases_with_samples(phased)
    parts += [GPU_STATE_DEFINITIONS, ""]
    if phased:
        parts += [GPU_PHASE_DEFINITIONS, ""]
    parts += [f"- Runs with GPU samples: {len(sampled)} of {len(used)} used runs; one row per "
              "run in `gpu_state.csv`."]
    if phased:
        parts += [f"- Runs with GPU samples by phase: {len(phased)} of {len(sampled)} (files "
                  "older than schema version 4 have none); one row per run, rank and phase "
                  "in `gpu_state_by_phase.csv`."]
    parts += [""]
    header = ["N", "runs", "samples", "SM clock, slowest rank (MHz)",
              "SM clock, all ranks (MHz)", "lowest SM clock (MHz)", "power (W)",
              "highest temperature (°C)", "power-capped", "clock event reasons"]
    csv_rows, phase_csv_rows = [], []
    for series in series_list:
        by_n = defaultdict(list)
        for run in series.runs:
            if has_samples(run):
                by_n[run.world_size].append(run)
        if not by_n:
            continue
        rows = [[str(n), str(len(by_n[n]))] + _gpu_state_row(gpu_metrics(by_n[n]))
                for n in sorted(by_n)]
        parts += [f"### {series.index}. {series.label}", "", table(header, rows), ""]
        phase_table = _gpu_phase_table(by_n, phases)
        if phase_table is not None:
            parts += ["By phase (the slowest rank's SM clock and the power while each phase "
                      "ran):", "", phase_table, ""]
        ordered = [run for n in sorted(by_n)
                   for run in sorted(by_n[n], key=lambda run: run.path)]
        csv_rows += _gpu_state_csv_rows(series, ordered, results_dir)
        phase_csv_rows += _gpu_phase_csv_rows(series, ordered, results_dir)
    pd.DataFrame(csv_rows).to_csv(out_dir / "gpu_state.csv", index=False)
    if phase_csv_rows:
        pd.DataFrame(phase_csv_rows).to_csv(out_dir / "gpu_state_by_phase.csv", index=False)
    return "\n".join(parts).rstrip()
