"""The /summary values of one run, recomputed from /steps and /collectives exactly as
docs/results-schema.md defines them, and the check against what the writer stored."""
import math

import numpy as np

from scalestudy_analysis.results.schema import SUMMARY_ATOL, SUMMARY_FLOAT_KEYS, SUMMARY_INPUT_KEYS, SUMMARY_RTOL


def quartiles(values):
    """(q1, median, q3) with numpy's default linear interpolation (Hyndman-Fan type 7),
    the definition the C++ writer uses too."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return (math.nan, math.nan, math.nan)
    q1, median, q3 = np.quantile(values, [0.25, 0.5, 0.75])
    return float(q1), float(median), float(q3)


def ratio(numerator, denominator):
    """numerator / denominator; NaN when the denominator is 0 or not finite."""
    if denominator == 0 or not np.isfinite(denominator):
        return math.nan
    return numerator / denominator


def compute_summary(run):
    """Recomputes /summary over the measured steps of a complete run: neither warm-up
    nor traced (run.measured)."""
    measured = run.measured
    quantities = run.quantities
    step_times = quantities.step_time[measured]
    q1, median, q3 = quartiles(step_times)
    comm_median = float(np.median(quantities.comm_time[measured]))
    exposed_median = float(np.median(quantities.exposed_comm[measured]))
    tokens_median = float(np.median(run.tokens[measured]))

    stored = run.stored_summary
    flops = float(stored.get("flops_per_step", math.nan))
    peak = float(stored.get("peak_tflops_per_gpu", math.nan))
    tflops = ratio(flops, median) / run.world_size / 1e12
    return {
        "steps_measured": int(measured.sum()),
        "step_time_median_s": median,
        "step_time_q1_s": q1,
        "step_time_q3_s": q3,
        "tokens_per_s": ratio(tokens_median, median),
        "flops_per_step": flops,
        "tflops_per_gpu": tflops,
        "peak_tflops_per_gpu": peak,
        "peak_source": str(stored.get("peak_source", "none")),
        "mfu": ratio(tflops, peak),
        "comm_time_median_s": comm_median,
        "exposed_comm_median_s": exposed_median,
        "exposed_comm_fraction": 0.0 if comm_median == 0 else exposed_median / comm_median,
        "comm_fraction_of_step": ratio(comm_median, median),
    }


def _close(stored, computed):
    if math.isnan(stored) and math.isnan(computed):
        return True
    return abs(stored - computed) <= SUMMARY_ATOL + SUMMARY_RTOL * abs(computed)


def compare_summary(stored, computed):
    """Names of the derived summary values where the file and the recomputation disagree."""
    mismatched = []
    if "steps_measured" not in stored or int(stored["steps_measured"]) != computed["steps_measured"]:
        mismatched.append("steps_measured")
    for key in SUMMARY_FLOAT_KEYS:
        if key in SUMMARY_INPUT_KEYS:
            continue
        if key not in stored:
            mismatched.append(f"{key} (absent)")
            continue
        try:
            value = float(stored[key])
        except (TypeError, ValueError):
            mismatched.append(key)
            continue
        if not _close(value, computed[key]):
            mismatched.append(f"{key} ({value:.6g} stored, {computed[key]:.6g} recomputed)")
    return mismatched
