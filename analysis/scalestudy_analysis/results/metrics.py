"""Series of runs and their scaling metrics: speedup, efficiency, Karp-Flatt serial
fraction, breakdown, communication fraction, throughput and MFU against world size."""
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scalestudy_analysis.results import machine
from scalestudy_analysis.results.reading import Problem
from scalestudy_analysis.results.schema import BATCH_KEY, PER_RUN_KEYS, SERIES_KEYS
from scalestudy_analysis.results.summary import quartiles, ratio


@dataclass
class Series:
    """Runs of one configuration (fields) and build or config variant at several N; table:
    one row per N (scaling_table) once group_series has built it."""
    fields: dict        # the series-defining config values, SERIES_KEYS + batch key
    variant: dict       # what separates this series from same-key runs of another build/config
    runs: list
    index: int = 0
    table: pd.DataFrame = field(default=None)

    @property
    def scaling(self):
        return self.fields["scaling"]

    @property
    def baseline_n(self):
        return int(min(run.world_size for run in self.runs))

    @property
    def strategy_label(self):
        overlap = "+overlap" if self.fields.get("overlap") == "on" else ""
        return f"{self.fields.get('strategy', '?')}{overlap}"

    @property
    def label(self):
        batch_key = BATCH_KEY.get(self.scaling, "global_batch")
        parts = [f"{self.fields.get('experiment') or '(no experiment)'}:",
                 self.fields.get("model", "?"), self.strategy_label, f"{self.scaling} scaling",
                 f"{batch_key}={self.fields.get(batch_key)}", f"seq={self.fields.get('seq')}",
                 f"grad_accum={self.fields.get('grad_accum')}", self.fields.get("precision", "?")]
        return " ".join(parts) + self.link_suffix + self.variant_suffix

    @property
    def link_suffix(self):
        """An emulated series says so in its name, so that no table or figure shows it as
        a run over the host's own links (its runs all share one emulation setting)."""
        kinds = sorted({machine.link_kind(run) for run in self.runs if machine.emulated(run)} - {None})
        if not any(machine.emulated(run) for run in self.runs):
            return ""
        return f" [{' / '.join(kinds) if kinds else 'emulated inter-node'}]"

    @property
    def variant_suffix(self):
        if not self.variant:
            return ""
        shown = [f"{key}={value}" for key, value in sorted(self.variant.items())][:3]
        return " [" + ", ".join(shown) + "]"

    @property
    def slug(self):
        text = f"{self.fields.get('model', '')}-{self.strategy_label}-{self.scaling}"
        return f"s{self.index:02d}-" + re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def _series_fields(run):
    config = run.config
    values = {key: config.get(key, run.attrs.get(key, "")) for key in SERIES_KEYS}
    batch_key = BATCH_KEY.get(values["scaling"], "global_batch")
    values[batch_key] = config.get(batch_key, "")
    return values


def _fingerprint(run):
    """What must agree between runs of one series: the build, the machine (device, backend,
    and for the CPU backend the CPU model and logical cores) and every config value that
    is not allowed to vary with world size or repeat."""
    items = {key: value for key, value in run.config.items() if key not in PER_RUN_KEYS}
    items.update(machine.describe(run))
    return tuple(sorted(items.items()))


def _differences(fingerprints):
    """Keys whose value differs between fingerprints, with each variant's values."""
    dicts = [dict(fp) for fp in fingerprints]
    keys = sorted(set().union(*dicts))
    differing = [key for key in keys if len({d.get(key) for d in dicts}) > 1]
    return differing, [{key: d.get(key, "(absent)") for key in differing} for d in dicts]


def _by_packing(runs):
    """Runs of one fingerprint split by how their ranks sit on nodes. A run on several
    nodes has a packing (ranks per node); one on a single node fits every packing of at
    least its world size, so it joins each such split (its N is measured the same way
    there). Returns [(packing or None, runs)]: one entry when there is no choice."""
    packings = sorted({machine.packing(run) for run in runs} - {None})
    if len(packings) <= 1:
        return [(None, runs)]
    splits = []
    for value in packings:
        capacity = machine.packing_capacity(value)
        splits.append((value, [run for run in runs if machine.packing(run) == value or
                               (machine.packing(run) is None and run.world_size <= capacity)]))
    placed = {id(run) for _, members in splits for run in members}
    alone = [run for run in runs if id(run) not in placed]
    if alone:
        splits.append(("1 node", alone))
    return splits


# The first key of these that differs names a split in Problems; any other is "config".
SPLIT_KINDS = ("git_sha", "device", "backend", "link_emulation", "cpu_model", "logical_cores",
               "ranks per node")


def _split_problem(fields_, members, variants, differing):
    kind = next((f"mixed {key}" for key in SPLIT_KINDS if key in differing), "mixed config")
    detail = "; ".join(", ".join(f"{k}={v}" for k, v in variant.items()) + f" ({len(runs)} runs)"
                       for variant, runs in variants)
    label = Series(fields=fields_, variant={}, runs=members).label
    return Problem(label, kind, f"runs of one series differ in {', '.join(differing)}: "
                   f"{detail}; analysed as {len(variants)} separate series, never averaged",
                   False)


def group_series(runs):
    """Usable runs grouped into series. A group whose runs disagree on build, machine,
    topology or config is split into variants, and each split is reported."""
    groups = defaultdict(list)
    for run in runs:
        if run.usable:
            groups[tuple(sorted(_series_fields(run).items()))].append(run)
    series_list, problems = [], []
    for key in sorted(groups):
        members = groups[key]
        by_variant = defaultdict(list)
        for run in members:
            by_variant[_fingerprint(run)].append(run)
        fingerprints = sorted(by_variant)
        differing, variants = _differences(fingerprints)
        fields_ = dict(key)
        split = []
        for fingerprint, variant in zip(fingerprints, variants):
            packed = _by_packing(by_variant[fingerprint])
            for value, packed_runs in packed:
                shown = dict(variant)
                if value is not None:
                    shown["ranks per node"] = value
                split.append((shown, packed_runs))
        if any("ranks per node" in variant for variant, _ in split):
            differing = differing + ["ranks per node"]
        for variant, packed_runs in split:
            series_list.append(Series(fields=fields_, variant=variant, runs=packed_runs))
        if len(split) > 1:
            problems.append(_split_problem(fields_, members, split, differing))
    for index, series in enumerate(series_list, start=1):
        series.index = index
        problems.extend(_duplicate_problems(series))
        problems.extend(_mixed_link_problems(series))
        series.table = scaling_table(series)
    return series_list, problems


def _duplicate_problems(series):
    seen = defaultdict(list)
    for run in series.runs:
        seen[(run.world_size, run.repeat)].append(run.path)
    return [Problem(series.label, "duplicate repeat", f"N={n} repeat={repeat!r} appears in "
                    f"{len(paths)} files ({', '.join(paths)}); all are pooled", False)
            for (n, repeat), paths in sorted(seen.items()) if len(paths) > 1]


def _mixed_link_problems(series):
    """Runs of one N whose NCCL chose different transports (the emulation setting, which
    splits series, agrees): their times are pooled, so the point says both links."""
    kinds = defaultdict(set)
    for run in series.runs:
        kinds[run.world_size].add(machine.link_kind(run))
    return [Problem(series.label, "mixed link", f"N={n}: the runs' links differ ({', '.join(sorted(found))}); "
                    "the point pools them and its link column names each", False)
            for n, found in sorted(kinds.items()) if len(found) > 1]


def _pooled(runs, name):
    """Values of one per-step quantity over the measured steps of all runs, concatenated."""
    arrays = []
    for run in runs:
        values = getattr(run.quantities, name) if name != "tokens" else run.tokens
        arrays.append(np.asarray(values, dtype=np.float64)[run.measured])
    return np.concatenate(arrays) if arrays else np.zeros(0)


def _compute_spread(runs):
    """Per measured step, how much longer the slowest rank's own compute took than the
    fastest rank's (max / min - 1 of forward ∪ backward less the waits in it), pooled
    over the runs; 0 on one rank. Unequal devices show here: a data-parallel step waits
    for its slowest rank."""
    spreads = []
    for run in runs:
        busy = np.asarray(run.quantities.compute_busy_per_rank, dtype=np.float64)[run.measured]
        if busy.size == 0:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            spreads.append(busy.max(axis=1) / busy.min(axis=1) - 1.0)
    values = np.concatenate(spreads) if spreads else np.zeros(0)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if values.size else math.nan


def _first_finite(values):
    for value in values:
        if value is not None and np.isfinite(value):
            return float(value)
    return math.nan


# Each breakdown part and the per-step quantity that holds it (intervals.StepQuantities).
BREAKDOWN_QUANTITY = {"compute": "compute", "optimizer": "optimizer",
                      "exposed_comm": "exposed_on_critical", "data": "data", "other": "other"}


def _breakdown(runs):
    """Per part: the mean, and the median with its quartiles, over the pooled measured
    steps; and how far the medians' sum lies from the median step (a fraction)."""
    values = {}
    median_sum = 0.0
    for part, quantity in BREAKDOWN_QUANTITY.items():
        pooled = _pooled(runs, quantity)
        q1, median, q3 = quartiles(pooled)
        values[f"{part}_mean_s"] = float(np.mean(pooled))
        values[f"breakdown_{part}_median_s"] = median
        values[f"breakdown_{part}_q1_s"] = q1
        values[f"breakdown_{part}_q3_s"] = q3
        median_sum += median
    values["breakdown_median_sum_s"] = median_sum
    return values


def _joined_or_dash(values):
    shown = sorted({value for value in values if value is not None})
    return " / ".join(shown) if shown else "—"


def comm_part_name(scope):
    """The breakdown's name for a point's communication: "inter-node comm", "intra-node
    comm", or "comm" where nothing is exchanged (one rank)."""
    return f"{scope} comm" if scope in ("inter-node", "intra-node") else "comm"


def point_metrics(runs, world_size, peak=math.nan):
    """Pooled values at one world size: all measured steps of all repeats together. peak:
    the FLOP rate MFU divides by (the series' one peak, series_peak)."""
    step_times = _pooled(runs, "step_time")
    q1, median, q3 = quartiles(step_times)
    tokens_median = float(np.median(_pooled(runs, "tokens")))
    comm_median = float(np.median(_pooled(runs, "comm_time")))
    exposed_median = float(np.median(_pooled(runs, "exposed_comm")))
    flops = _first_finite(run.summary.get("flops_per_step") for run in runs)
    tflops = ratio(flops, median) / world_size / 1e12
    breakdown = _breakdown(runs)
    # One rank has no peer: a collective there moves nothing, and the share of it left
    # exposed says nothing, so the fraction is undefined rather than 100 %.
    communicates = world_size > 1 and comm_median > 0
    return {
        "N": world_size,
        "topology": " / ".join(sorted({machine.topology(run) for run in runs})),
        # Where the point's collectives ran and through what; runs of one point share
        # their emulation setting (the series' fingerprint), not always NCCL's choice.
        "comm_scope": _joined_or_dash(machine.comm_scope(run) for run in runs),
        "link": _joined_or_dash(machine.link_kind(run) for run in runs),
        "repeats": len({run.repeat for run in runs}),
        "runs": len(runs),
        "steps": int(step_times.size),
        "step_time_median_s": median,
        "step_time_q1_s": q1,
        "step_time_q3_s": q3,
        "tokens_per_step": tokens_median,
        "tokens_per_s": ratio(tokens_median, median),
        # The throughput band of the step time's IQR: its first quartile is the slowest
        # quarter's edge, tokens over the step's third quartile.
        "tokens_per_s_q1": ratio(tokens_median, q3),
        "tokens_per_s_q3": ratio(tokens_median, q1),
        "comm_time_median_s": comm_median,
        "exposed_comm_median_s": exposed_median,
        "exposed_comm_fraction": exposed_median / comm_median if communicates else math.nan,
        "comm_fraction_of_step": ratio(comm_median, median),
        "exposed_fraction_of_step": ratio(exposed_median, median),
        "tflops_per_gpu": tflops,
        "peak_tflops_per_gpu": peak,
        "mfu": ratio(tflops, peak),
        "compute_spread": _compute_spread(runs),
        **breakdown,
        "breakdown_sum_error": ratio(breakdown["breakdown_median_sum_s"], median) - 1.0,
        "step_time_mean_s": float(np.mean(step_times)),
    }


def series_peak(runs):
    """The peak FLOP rate of a series and the spread of the runs' peaks, (median, lowest,
    highest). A datasheet peak is the same in every run; a peak the run measured (the CPU
    backend's) varies from run to run, and one value for the whole series keeps its MFU
    comparable across N."""
    peaks = np.array([run.summary.get("peak_tflops_per_gpu", math.nan) for run in runs],
                     dtype=np.float64)
    peaks = peaks[np.isfinite(peaks)]
    if peaks.size == 0:
        return math.nan, math.nan, math.nan
    return float(np.median(peaks)), float(peaks.min()), float(peaks.max())


def karp_flatt(speedup, p):
    """Experimentally determined serial fraction; undefined at p = 1."""
    speedup = np.asarray(speedup, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (1.0 / speedup - 1.0 / p) / (1.0 - 1.0 / p)
    return np.where(p > 1, value, np.nan)


def scaling_table(series):
    """One row per world size. Speedup and efficiency are throughput ratios against the
    smallest world size measured, N0: for strong scaling tokens per step are fixed, so
    this equals T(N0)/T(N)."""
    by_n = defaultdict(list)
    for run in series.runs:
        by_n[run.world_size].append(run)
    peak = series_peak(series.runs)[0]
    table = pd.DataFrame([point_metrics(by_n[n], n, peak) for n in sorted(by_n)])
    n0 = table["N"].iloc[0]
    base = table["tokens_per_s"].iloc[0]
    p = table["N"] / n0
    table["speedup"] = table["tokens_per_s"] / base
    table["speedup_q1"] = table["tokens_per_s_q1"] / base
    table["speedup_q3"] = table["tokens_per_s_q3"] / base
    # Strong: S(N) * N0 / N. Weak: per-rank throughput at N over that at N0, which is
    # the same expression; only the meaning of "speedup" differs (throughput ratio).
    table["efficiency"] = table["speedup"] / p
    table["karp_flatt"] = karp_flatt(table["speedup"], p) if series.scaling != "weak" else np.nan
    table["efficiency_q1"] = table["speedup_q1"] / p
    table["efficiency_q3"] = table["speedup_q3"] / p
    return table


def legend_labels(series_list):
    """Shortest labels that still tell the plotted series apart: only the fields that
    vary between them, plus the strategy, which every reader looks for."""
    if not series_list:
        return []
    keys = ["experiment", "model", "scaling", "grad_accum", "precision", "seq",
            "global_batch", "batch_per_rank"]
    varying = [key for key in keys
               if len({s.fields.get(key) for s in series_list}) > 1]
    labels = []
    for series in series_list:
        parts = [series.strategy_label]
        parts += [f"{key}={series.fields.get(key)}" if key not in ("model", "experiment")
                  else str(series.fields.get(key)) for key in varying
                  if series.fields.get(key) is not None]
        labels.append(" ".join(parts) + series.variant_suffix)
    return labels
