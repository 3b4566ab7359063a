"""The GPUs' state per step and rank (/steps/gpu_*, docs/results-schema.md, version 3):
reading it with the checks that turn a malformed dataset into a reported problem, and the
numbers of the report's "GPU state" section, over the measured steps of a set of runs."""
import math
from dataclasses import dataclass

import numpy as np

from .problems import Problem
from .step_datasets import MalformedStepDatasets, StepDatasetFamily, read_step_datasets
from .schema import (CLOCK_EVENT_REASON_NAMES, GPU_CLOCK_EVENT_REASONS_DATASET,
                     GPU_SAMPLES_DATASET, GPU_STATE_DATASETS, GPU_STATE_VERSION)

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
    # A gpu_phase_state.GpuPhaseState of /steps/gpu_phase_*, read once these have proved
    # sound; None before version 4, or when those datasets are missing or malformed.
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
