"""A common baseline: every series' efficiency against one series' N0, so that strategies
compare on one scale. By default, among the series of one kind (comparable_key) run on one
machine and build, the one fastest at the smallest N any of them measured; `--baseline
SERIES` names another. Efficiency against a baseline series b is
throughput(N) · N0_b / (N · throughput_b(N0_b)): for strong scaling the speedup over b's
smallest run per rank added; for weak scaling tokens/s per rank over b's at N0_b."""
from collections import defaultdict

import numpy as np

from scalestudy_analysis.results import machine
from scalestudy_analysis.results.schema import BATCH_KEY


class BaselineError(Exception):
    """The --baseline given matches no series, or more than one where one is needed."""


def comparable_key(series):
    """Series whose throughputs may be set against each other: one model, scaling mode,
    sequence length and batch (global for strong scaling, per rank for weak)."""
    batch_key = BATCH_KEY.get(series.scaling, "global_batch")
    return (series.fields.get("model"), series.scaling, series.fields.get("seq"),
            series.fields.get(batch_key))


def _matches(series, spec):
    """spec: a series number, a strategy label (ddp, zero2+overlap), or key=value pairs
    separated by commas over the series' fields and what its runs ran on."""
    if spec.isdigit():
        return series.index == int(spec)
    if "=" not in spec:
        return series.strategy_label == spec
    values = dict(series.fields)
    values["strategy"] = series.fields.get("strategy")
    for run in series.runs:
        for key, value in machine.describe(run).items():
            values.setdefault(key, value)
    for pair in spec.split(","):
        key, _, value = pair.partition("=")
        if str(values.get(key.strip())) != value.strip():
            return False
    return True


def _machine(series):
    return tuple(sorted({tuple(sorted(machine.describe(run).items())) for run in series.runs}))


def resolve(series_list, spec):
    """{series index: baseline series} for every series that has a baseline of its kind
    among those the spec matches. One match of a series' kind serves it; among several,
    the one on the same machine and build, and several even then is an error. A series
    with no match of its kind keeps only its own N0."""
    matched = [s for s in series_list if _matches(s, spec)]
    if not matched:
        raise BaselineError(f"--baseline {spec!r} matches no series (give a number, a "
                            "strategy such as ddp or zero2+overlap, or key=value pairs)")
    chosen = {}
    for series in series_list:
        candidates = [b for b in matched if comparable_key(b) == comparable_key(series)]
        if len(candidates) > 1:
            candidates = [b for b in candidates if _machine(b) == _machine(series)]
        if len(candidates) > 1:
            raise BaselineError(f"--baseline {spec!r} matches series "
                                + ", ".join(str(b.index) for b in candidates)
                                + f" for series {series.index}; name one by its number")
        if candidates:
            chosen[series.index] = candidates[0]
    return chosen


def default_baselines(series_list):
    """{series index: baseline series}: for each group of series of one kind on one machine
    and build, the member with the highest throughput at the smallest N of the group, so
    that series differing only in strategy or overlap share one baseline: each strategy's
    own N0 would make one that is slower on few GPUs look as if it scaled better."""
    groups = defaultdict(list)
    for series in series_list:
        groups[(comparable_key(series), _machine(series))].append(series)
    chosen = {}
    for members in groups.values():
        n0 = min(series.baseline_n for series in members)
        fastest = max((series for series in members if series.baseline_n == n0),
                      key=lambda series: float(series.table.set_index("N").loc[n0, "tokens_per_s"]))
        chosen.update({series.index: fastest for series in members})
    return chosen


def add_common_efficiency(series_list, spec):
    """Adds to each series' table the efficiency against its baseline series
    (efficiency_common, with _q1 and _q3 from the throughput's IQR band) and the
    baseline's number and N0; NaN for a series without one. The baselines are those
    --baseline names (spec), or else default_baselines'. Returns {index: baseline}."""
    chosen = resolve(series_list, spec) if spec else default_baselines(series_list)
    for series in series_list:
        table = series.table
        baseline = chosen.get(series.index)
        if baseline is None:
            for column in ("efficiency_common", "efficiency_common_q1", "efficiency_common_q3",
                           "baseline_series", "baseline_n"):
                table[column] = np.nan
            continue
        base_n = baseline.baseline_n
        base = float(baseline.table.set_index("N").loc[base_n, "tokens_per_s"])
        scale = base_n / (table["N"].to_numpy(dtype=float) * base)
        table["efficiency_common"] = table["tokens_per_s"] * scale
        table["efficiency_common_q1"] = table["tokens_per_s_q1"] * scale
        table["efficiency_common_q3"] = table["tokens_per_s_q3"] * scale
        table["baseline_series"] = baseline.index
        table["baseline_n"] = base_n
    return chosen
