"""`scalestudy-report compare A B [C ...]`: result sets side by side. For every (model,
scaling, strategy, N) that A and another set both measured: the ratio of throughput,
step time and efficiency, each with a bootstrap interval over repeats and steps, a
verdict at a stated level, and how many more repeats would decide an undecided point."""
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import machine
from .bootstrap import MORE_REPEATS_SHOWN, UNDECIDED, Ratio, median_replicates, point_rng
from .load import load_results
from .markdown import table
from .metrics import group_series

DEFAULTS = {"level": 0.95, "threshold": 0.01, "resamples": 2000, "seed": 0}


@dataclass
class ResultSet:
    label: str
    path: Path
    runs: list
    series: list
    problems: list
    # (model, scaling, strategy) -> the one series of that key; keys held by several
    # series of the set (other batch, device, ...) are in `ambiguous` instead.
    by_key: dict = field(default_factory=dict)
    ambiguous: dict = field(default_factory=dict)


def series_key(series):
    return (series.fields.get("model", "?"), series.scaling, series.strategy_label)


def load_set(label, path):
    runs, _, problems = load_results(path)
    series_list, series_problems = group_series(runs)
    result = ResultSet(label, Path(path), runs, series_list, problems + series_problems)
    grouped = defaultdict(list)
    for series in series_list:
        grouped[series_key(series)].append(series)
    for key, members in grouped.items():
        if len(members) == 1:
            result.by_key[key] = members[0]
        else:
            result.ambiguous[key] = members
    return result


def _runs_at(series, n):
    return [run for run in series.runs if run.world_size == n]


@dataclass
class Sample:
    """One set's measurements at one N: what the ratios are built from."""
    step_times: list          # per run, its measured step times
    tokens: float             # median tokens per step over every measured step
    repeats: int

    @classmethod
    def of(cls, runs):
        tokens = np.concatenate([run.tokens[run.measured] for run in runs]).astype(np.float64)
        return cls([run.measured_step_times() for run in runs], float(np.median(tokens)),
                   len({run.repeat for run in runs}))

    def median(self):
        return float(np.median(np.concatenate(self.step_times)))


def _replicates(sample, options, key):
    return median_replicates(sample.step_times, options["resamples"],
                             point_rng(options["seed"], key))


def _described(series):
    """A series' defining fields and what its runs ran on and were built from."""
    values = {key: str(value) for key, value in series.fields.items()}
    by_name = defaultdict(set)
    for run in series.runs:
        for name, value in machine.describe(run).items():
            by_name[name].add(value)
    values.update({name: " + ".join(sorted(found)) for name, found in by_name.items()})
    return values


def differences(a, b):
    """What differs between two paired series beyond the key they are paired on."""
    first, second = _described(a), _described(b)
    skip = {"experiment", "model", "scaling", "strategy", "overlap"}
    return [f"{key}: {first.get(key, '—')} → {second.get(key, '—')}"
            for key in sorted(set(first) | set(second))
            if key not in skip and first.get(key) != second.get(key)]


def compare_pair(reference, other, options):
    """Rows of the comparison of `other` against `reference`, one per key and N that both
    measured."""
    rows = []
    for key in sorted(set(reference.by_key) & set(other.by_key)):
        a, b = reference.by_key[key], other.by_key[key]
        sizes = sorted({r.world_size for r in a.runs} & {r.world_size for r in b.runs})
        if not sizes:
            continue
        samples = {(name, n): Sample.of(_runs_at(series, n)) for name, series in (("a", a), ("b", b))
                   for n in sizes}
        replicates = {(name, n): _replicates(sample, options, (other.label, key, name, n))
                      for (name, n), sample in samples.items()}
        n0 = sizes[0]
        what_differs = differences(a, b)
        for n in sizes:
            rows.append(_row(reference, other, key, n, n0, samples, replicates, options,
                             what_differs))
    return rows


def _row(reference, other, key, n, n0, samples, replicates, options, what_differs):
    level, threshold = options["level"], options["threshold"]
    a, b = samples[("a", n)], samples[("b", n)]
    step = Ratio.of(b.median() / a.median(), replicates[("b", n)] / replicates[("a", n)], level)
    # Throughput is tokens per step over the median step: its ratio scales the inverse.
    tokens = b.tokens / a.tokens
    throughput = Ratio(tokens / step.estimate, tokens / step.high, tokens / step.low, level)
    if n == n0:
        efficiency = Ratio(math.nan, math.nan, math.nan, level)
    else:
        # Each set's efficiency against its own N0 (the smallest N both measured): the
        # ratio of the two is the ratio of their throughput ratios N / N0.
        base = samples[("b", n0)].median() / samples[("a", n0)].median()
        efficiency = Ratio.of(base / step.estimate,
                              (replicates[("b", n0)] / replicates[("a", n0)])
                              / (replicates[("b", n)] / replicates[("a", n)]), level)
    repeats = min(a.repeats, b.repeats)
    verdict = throughput.verdict(threshold)
    more = throughput.more_repeats(repeats, threshold)
    return {
        "reference": reference.label, "compared": other.label,
        "model": key[0], "scaling": key[1], "strategy": key[2], "N": n, "N0": n0,
        "repeats_reference": a.repeats, "repeats_compared": b.repeats,
        "throughput_ratio": throughput, "step_time_ratio": step, "efficiency_ratio": efficiency,
        "verdict": verdict,
        "efficiency_verdict": efficiency.verdict(threshold) if n != n0 else "",
        "more_repeats": more,
        "differs": "; ".join(what_differs),
    }


def _more_cell(row):
    more = row["more_repeats"]
    if row["verdict"] != UNDECIDED:
        return "—"
    if more is None:
        return "none would (the estimate sits at the band's edge)"
    return (f"more than {MORE_REPEATS_SHOWN} more per set" if more > MORE_REPEATS_SHOWN
            else f"about {more} more per set")


RATIO_COLUMNS = ("throughput_ratio", "step_time_ratio", "efficiency_ratio")


def flat_rows(rows):
    """Rows with every Ratio spread into estimate, low and high columns."""
    flat = []
    for row in rows:
        out = {k: v for k, v in row.items() if k not in RATIO_COLUMNS}
        for column in RATIO_COLUMNS:
            ratio = row[column]
            out[column] = ratio.estimate
            out[f"{column}_low"] = ratio.low
            out[f"{column}_high"] = ratio.high
        out["level"] = row["throughput_ratio"].level
        flat.append(out)
    return flat


def comparison_table(rows):
    header = ["model", "scaling", "strategy", "N", "repeats A / B", "throughput B/A [CI]",
              "verdict", "step time B/A [CI]", "efficiency B/A [CI]", "efficiency verdict",
              "to decide", "what differs"]
    lines = []
    for row in rows:
        lines.append([row["model"], row["scaling"], row["strategy"], str(row["N"]),
                      f"{row['repeats_reference']} / {row['repeats_compared']}",
                      row["throughput_ratio"].cell(), f"**{row['verdict']}**",
                      row["step_time_ratio"].cell(), row["efficiency_ratio"].cell(),
                      row["efficiency_verdict"] or "—", _more_cell(row), row["differs"] or "—"])
    return table(header, lines)


def unmatched_lines(reference, other):
    lines = []
    for mine, theirs in ((reference, other), (other, reference)):
        for key in sorted(set(mine.by_key) - set(theirs.by_key) - set(theirs.ambiguous)):
            lines.append(f"- {' '.join(key)}: only in {mine.label}")
    for result in (reference, other):
        for key, members in sorted(result.ambiguous.items()):
            labels = "; ".join(f"`{s.label}`" for s in members)
            lines.append(f"- {' '.join(key)}: {len(members)} series in {result.label} "
                         f"({labels}); not compared, since which to pair is not clear: "
                         "compare folders that hold one of them each")
    return lines
