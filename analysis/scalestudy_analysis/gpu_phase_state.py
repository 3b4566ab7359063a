"""The GPUs' state by phase (/steps/gpu_phase_*, docs/results-schema.md, version 4): each
step's samples attributed to the phases whose intervals held them. Reading it with the
checks that turn a malformed dataset into a reported problem, and the numbers of the
"GPU state" section's tables by phase, over the measured steps of a set of runs."""
import math
from dataclasses import dataclass

import numpy as np

from .gpu_state import PROBLEM_KIND
from .problems import Problem
from .step_datasets import MalformedStepDatasets, StepDatasetFamily, read_step_datasets
from .schema import (GPU_PHASE_SAMPLES_DATASET, GPU_PHASE_STATE_DATASETS,
                     GPU_PHASE_STATE_VERSION, GPU_STATE_REPORT_PHASES, PHASE, PHASE_NAMES)


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


def _problem(path, message):
    # The per-step datasets were read and checked on their own and do not depend on these,
    # so only the by-phase part goes.
    return Problem(path, PROBLEM_KIND, f"{message}; the run's GPU state by phase is left "
                   "out, its GPU state per step is kept", False)


def _read_dataset(steps, name, expected_shape):
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
_FAMILY = StepDatasetFamily(prefix="gpu_phase_", datasets=GPU_PHASE_STATE_DATASETS,
                            samples_dataset=GPU_PHASE_SAMPLES_DATASET, cells="step-rank-phase",
                            read_dataset=_read_dataset, problem=_problem,
                            absent_note="read as no GPU samples by phase")


def read_gpu_phase_state(handle, path, schema_version, n_steps, world_size):
    """(state, problems) for an open run file. state is None before version 4, and when the
    datasets are missing or malformed, which is then the one problem."""
    if schema_version < GPU_PHASE_STATE_VERSION:
        return None, []
    values, problems = read_step_datasets(handle, path, schema_version, _FAMILY,
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


def _median(values):
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
                         "sm_clock_median_mhz": _median(_sampled(run, "sm_clock_mhz", phase,
                                                                 rank)),
                         "power_median_w": _median(_sampled(run, "power_w", phase, rank))})
    return rows


def slowest_rank_clock(run, phase):
    """The lowest over the run's ranks of each rank's median phase SM clock over the
    measured steps. A phase holds a sample in some steps only when it is shorter than the
    sampling period, so the ranks are compared by their medians, not step by step; a rank
    without a clock reading in the phase is skipped. NaN when no rank has one."""
    index = PHASE[phase]
    medians = [_median(_sampled(run, "sm_clock_mhz", index, rank))
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
        "sm_clock_slowest_rank_median_mhz": _median(clocks[np.isfinite(clocks)]),
        "power_median_w": _median(power),
    }
