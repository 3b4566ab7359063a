"""The GPUs' state, read with the checks that turn a malformed dataset into a reported
problem, and its figures over the measured steps of a set of runs: per step and rank
(/steps/gpu_*, docs/results-schema.md, version 3), and by phase (/steps/gpu_phase_*,
version 4), each step's samples attributed to the phases whose intervals held them. The
report's "GPU state" section, which shows them, is report/gpu_section.py."""
import math
from dataclasses import dataclass

import numpy as np

from scalestudy_analysis.results.reading import MalformedStepDatasets, Problem, StepDatasetFamily, read_step_datasets
from scalestudy_analysis.results.schema import (CLOCK_EVENT_REASON_NAMES, GPU_CLOCK_EVENT_REASONS_DATASET, GPU_PHASE_SAMPLES_DATASET,
                     GPU_PHASE_STATE_DATASETS, GPU_PHASE_STATE_VERSION, GPU_SAMPLES_DATASET,
                     GPU_STATE_DATASETS, GPU_STATE_REPORT_PHASES, GPU_STATE_VERSION, PHASE, PHASE_NAMES)

PROBLEM_KIND = "gpu state"


@dataclass
class GpuState:
    """One run's /steps/gpu_* datasets, each [S, R] like the rows of /steps."""
    samples: np.ndarray                 # int64
    sm_clock_mhz: np.ndarray            # the samples' mean; NaN where there were none
    sm_clock_min_mhz: np.ndarray
    power_w: np.ndarray
    temperature_c: np.ndarray           # the highest sample
    power_capped: np.ndarray            # fraction of the samples at the software power cap
    clock_event_reasons: np.ndarray     # int64, OR of the samples' reason bits
    # A GpuPhaseState of /steps/gpu_phase_*, read once these have proved sound; None
    # before version 4, or when those datasets are missing or malformed.
    phases: object = None


_INTEGER_DATASETS = (GPU_SAMPLES_DATASET, GPU_CLOCK_EVENT_REASONS_DATASET)


def _problem(path, message):
    # No timing depends on the GPU state, so the run stays in every scaling number; only
    # its GPU state is dropped.
    return Problem(path, PROBLEM_KIND, f"{message}; the run's GPU state is left out", False)


def _read_dataset(steps, name, expected_shape):
    values = steps[name][()]
    if values.shape != expected_shape:
        raise MalformedStepDatasets(f"/steps/{name} has shape {list(values.shape)}, expected "
                                    f"[S, R] = {list(expected_shape)} like /steps/intervals")
    return values.astype(np.int64 if name in _INTEGER_DATASETS else np.float64)


# Like /steps/traced in version 2, a file without them is read as one without samples,
# but named, since every version 3 writer records them (0 samples on the CPU).
_FAMILY = StepDatasetFamily(prefix="gpu_", datasets=GPU_STATE_DATASETS,
                            samples_dataset=GPU_SAMPLES_DATASET, cells="step-rank",
                            read_dataset=_read_dataset, problem=_problem,
                            absent_note="read as no GPU samples")


def read_gpu_state(handle, path, schema_version, n_steps, world_size):
    """(state, problems) for an open run file. state is None before version 3, and when
    the datasets are missing or malformed, which is then the one problem."""
    if schema_version < GPU_STATE_VERSION:
        return None, []
    values, problems = read_step_datasets(handle, path, schema_version, _FAMILY,
                                          (n_steps, world_size))
    if values is None:
        return None, problems
    return GpuState(**values), []


def has_samples(run):
    """Whether the run's measured steps carry any GPU sample: not on the CPU backend, with
    --gpu-telemetry-ms 0, without NVML, or before schema version 3."""
    state = run.gpu_state
    return state is not None and int(state.samples[run.measured].sum()) > 0


def reason_names(bits):
    """The names of the clock event reasons set in bits, in bit order; bits the schema
    does not name are shown in hex rather than dropped."""
    bits = int(bits)
    names = [name for bit, name in sorted(CLOCK_EVENT_REASON_NAMES.items()) if bits & bit]
    unnamed = bits & ~sum(CLOCK_EVENT_REASON_NAMES)
    if unnamed:
        names.append(hex(unnamed))
    return names


def _finite(values):
    values = np.asarray(values, dtype=np.float64).ravel()
    return values[np.isfinite(values)]


def _median(values):
    values = _finite(values)
    return float(np.median(values)) if values.size else math.nan


def _slowest_rank_clocks(state, measured):
    """Per measured step, the lowest of the ranks' mean SM clocks; a rank without a clock
    reading in a step is skipped, and a step where no rank has one is dropped."""
    clocks = state.sm_clock_mhz[measured]
    lowest = np.where(np.isnan(clocks), np.inf, clocks).min(axis=1, initial=np.inf)
    return lowest[np.isfinite(lowest)]


def gpu_metrics(runs):
    """The section's numbers over the measured steps and every rank of runs, pooled as the
    timing tables pool the steps of all repeats at one N."""
    parts = [(run.gpu_state, run.measured) for run in runs]
    samples = np.concatenate([state.samples[measured].ravel() for state, measured in parts])

    def pooled(field):
        return np.concatenate([getattr(state, field)[measured].ravel()
                               for state, measured in parts])

    capped = pooled("power_capped")
    weighted = np.isfinite(capped) & (samples > 0)
    weight = samples[weighted].sum()
    lowest = _finite(pooled("sm_clock_min_mhz"))
    hottest = _finite(pooled("temperature_c"))
    reasons = int(np.bitwise_or.reduce(pooled("clock_event_reasons"), initial=0))
    return {
        "steps": int(sum(int(measured.sum()) for _, measured in parts)),
        "samples": int(samples.sum()),
        "sm_clock_slowest_rank_median_mhz": _median(np.concatenate(
            [_slowest_rank_clocks(state, measured) for state, measured in parts])),
        "sm_clock_median_mhz": _median(pooled("sm_clock_mhz")),
        "sm_clock_lowest_mhz": float(lowest.min()) if lowest.size else math.nan,
        "power_median_w": _median(pooled("power_w")),
        "temperature_highest_c": float(hottest.max()) if hottest.size else math.nan,
        "power_capped_fraction": (float((capped[weighted] * samples[weighted]).sum() / weight)
                                  if weight > 0 else math.nan),
        "clock_event_reasons": reasons,
    }


@dataclass
class GpuPhaseState:
    """One run's /steps/gpu_phase_* datasets, each [S, R, P] with P in PHASE_NAMES order.
    A sample counts in every phase whose interval held it, so phases that overlap (grad-comm
    beside backward, step around everything) share samples."""
    samples: np.ndarray                 # int64
    sm_clock_mhz: np.ndarray            # the samples' mean; NaN where there were none
    power_w: np.ndarray


_EXPECTED_DTYPE = {name: "int64" if name == GPU_PHASE_SAMPLES_DATASET else "float64"
                   for name in GPU_PHASE_STATE_DATASETS}


def _phase_problem(path, message):
    # The per-step datasets were read and checked on their own and do not depend on these,
    # so only the by-phase part goes.
    return Problem(path, PROBLEM_KIND, f"{message}; the run's GPU state by phase is left "
                   "out, its GPU state per step is kept", False)


def _read_phase_dataset(steps, name, expected_shape):
    dataset = steps[name]
    if dataset.shape != expected_shape:
        shape = list(dataset.shape) if dataset.shape is not None else "none"
        raise MalformedStepDatasets(f"/steps/{name} has shape {shape}, expected [S, R, P] = "
                                     f"{list(expected_shape)} like /steps/intervals")
    # Casting would let a count stored as floats, or a mean stored as integers or text,
    # pass for what the schema defines; a writer that stores them so follows another one.
    expected = _EXPECTED_DTYPE[name]
    if dataset.dtype.kind not in ("iu" if expected == "int64" else "f"):
        raise MalformedStepDatasets(f"/steps/{name} has dtype {dataset.dtype}, expected "
                                     f"{expected}")
    return dataset[()].astype(expected)


# Like /steps/gpu_* in version 3: every version 4 writer records them (0 samples on the
# CPU), so their absence is named, and the file reads as one without them.
_PHASE_FAMILY = StepDatasetFamily(prefix="gpu_phase_", datasets=GPU_PHASE_STATE_DATASETS,
                            samples_dataset=GPU_PHASE_SAMPLES_DATASET, cells="step-rank-phase",
                            read_dataset=_read_phase_dataset, problem=_phase_problem,
                            absent_note="read as no GPU samples by phase")


def read_gpu_phase_state(handle, path, schema_version, n_steps, world_size):
    """(state, problems) for an open run file. state is None before version 4, and when the
    datasets are missing or malformed, which is then the one problem."""
    if schema_version < GPU_PHASE_STATE_VERSION:
        return None, []
    values, problems = read_step_datasets(handle, path, schema_version, _PHASE_FAMILY,
                                          (n_steps, world_size, len(PHASE_NAMES)))
    if values is None:
        return None, problems
    return GpuPhaseState(**values), []


def _phases(run):
    return run.gpu_state.phases if run.gpu_state is not None else None


def phase_samples(run):
    """Samples per phase, [P], over the run's measured steps and all its ranks; zeros
    without a state by phase."""
    phases = _phases(run)
    if phases is None:
        return np.zeros(len(PHASE_NAMES), dtype=np.int64)
    return phases.samples[run.measured].sum(axis=(0, 1))


def has_phase_samples(run):
    """Whether a phase the report shows holds a sample in the run's measured steps: a
    version 4 run with GPU samples, unless every sample fell in data or step alone."""
    counts = phase_samples(run)
    return any(counts[PHASE[phase]] > 0 for phase in GPU_STATE_REPORT_PHASES)


def phases_with_samples(runs):
    """The phases the report shows, in phase order, that hold a sample in some run."""
    return [phase for phase in GPU_STATE_REPORT_PHASES
            if any(phase_samples(run)[PHASE[phase]] > 0 for run in runs)]


def _sampled(run, field, phase, rank=None):
    """The field's values in the measured steps where phase (an index) held a sample and
    the value is finite (NVML may have answered none of a quantity's reads), of one rank
    or, with rank None, of every rank."""
    phases = _phases(run)
    ranks = slice(None) if rank is None else rank
    samples = phases.samples[run.measured][:, ranks, phase]
    values = getattr(phases, field)[run.measured][:, ranks, phase]
    return values[(samples > 0) & np.isfinite(values)]


def _median_of_samples(values):
    return float(np.median(values)) if values.size else math.nan


def rank_phase_rows(run):
    """One row per rank and phase (every phase, in phase order) that holds a sample in the
    run's measured steps: the samples, how many of those steps held one, and the medians
    over those steps of the phase's mean SM clock and mean power."""
    phases = _phases(run)
    samples = phases.samples[run.measured]
    rows = []
    for rank in range(samples.shape[1]):
        for phase, name in enumerate(PHASE_NAMES):
            counts = samples[:, rank, phase]
            if counts.sum() == 0:
                continue
            rows.append({"rank": rank, "phase": name, "samples": int(counts.sum()),
                         "steps_with_samples": int((counts > 0).sum()),
                         "sm_clock_median_mhz": _median_of_samples(_sampled(run, "sm_clock_mhz", phase,
                                                                 rank)),
                         "power_median_w": _median_of_samples(_sampled(run, "power_w", phase, rank))})
    return rows


def slowest_rank_clock(run, phase):
    """The lowest over the run's ranks of each rank's median phase SM clock over the
    measured steps. A phase holds a sample in some steps only when it is shorter than the
    sampling period, so the ranks are compared by their medians, not step by step; a rank
    without a clock reading in the phase is skipped. NaN when no rank has one."""
    index = PHASE[phase]
    medians = [_median_of_samples(_sampled(run, "sm_clock_mhz", index, rank))
               for rank in range(run.gpu_state.phases.samples.shape[1])]
    finite = [value for value in medians if math.isfinite(value)]
    return min(finite) if finite else math.nan


def gpu_phase_metrics(runs, phase):
    """One phase's numbers for the runs at one point: the samples, the median over the runs
    of each run's slowest-rank clock, and the median power over every measured step and
    rank of all the runs, pooled as the per-step table pools them."""
    index = PHASE[phase]
    clocks = np.array([slowest_rank_clock(run, phase) for run in runs], dtype=np.float64)
    power = np.concatenate([_sampled(run, "power_w", index) for run in runs])
    return {
        "samples": int(sum(int(phase_samples(run)[index]) for run in runs)),
        "sm_clock_slowest_rank_median_mhz": _median_of_samples(clocks[np.isfinite(clocks)]),
        "power_median_w": _median_of_samples(power),
    }
