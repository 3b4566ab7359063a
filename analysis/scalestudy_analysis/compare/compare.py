"""`scalestudy-report compare A B [C ...]`: result sets side by side. For every (model,
scaling, strategy, N) that A and another set both measured: the ratio of throughput,
step time and efficiency, each with a bootstrap interval over repeats and steps, a
verdict at a stated level, and how many more repeats would decide an undecided point;
written as compare.md (and its HTML), compare.csv, compare.json and one figure of the
ratios against N per compared set. Series that ran different work (model shape, batch,
sequence length, precision, gradient accumulation) are listed as not comparable, with no
ratio and no verdict: compare is for what runs the same work differently (device, build,
network, strategy)."""
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from scalestudy_analysis import __version__

from scalestudy_analysis.results import machine  # noqa: E402
from scalestudy_analysis.compare.bootstrap import MORE_REPEATS_SHOWN, UNDECIDED, Ratio, median_replicates, point_rng  # noqa: E402
from scalestudy_analysis.render.html import write_html  # noqa: E402
from scalestudy_analysis.results.load import load_results  # noqa: E402
from scalestudy_analysis.render.markdown import relative, table  # noqa: E402
from scalestudy_analysis.results.metrics import group_series  # noqa: E402
from scalestudy_analysis.render.figures import DPI, legend_outside, world_size_axis  # noqa: E402

DEFAULTS = {"level": 0.95, "threshold": 0.01, "resamples": 2000, "seed": 0}
# What makes two runs the same work. Two series that differ in any of these measure
# different work, so a ratio of their speeds mixes what is being compared (device, build,
# network, strategy) with the work itself: such a pair gets no ratios and no verdict.
WORKLOAD_KEYS = ("layers", "hidden", "heads", "vocab", "max_seq", "attention", "seq", "precision",
                 "grad_accum", "global_batch", "batch_per_rank")
NOT_COMPARABLE = "not comparable"


@dataclass
class ResultSet:
    """One result set as compared: label, directory, runs, series and problems; series indexed
    by series_key, a key that several series share going to `ambiguous`."""
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
    """(model, scaling, strategy label): the key that pairs a series with one of another set."""
    return (series.fields.get("model", "?"), series.scaling, series.strategy_label)


def load_set(label, path):
    """Reads the result files under `path` into a ResultSet named `label`."""
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


def workload_differences(a_runs, b_runs):
    """The workload keys whose values differ between two groups of runs, each as
    "key: A's values → B's values"."""
    def values(runs, key):
        return " + ".join(sorted({str(run.config.get(key, "—")) for run in runs}))
    return [f"{key}: {values(a_runs, key)} → {values(b_runs, key)}" for key in WORKLOAD_KEYS
            if values(a_runs, key) != values(b_runs, key)]


def _not_comparable_row(reference, other, key, n, work, level):
    nothing = Ratio(math.nan, math.nan, math.nan, level)
    return {"reference": reference.label, "compared": other.label,
            "model": key[0], "scaling": key[1], "strategy": key[2], "N": n, "N0": math.nan,
            "repeats_reference": 0, "repeats_compared": 0,
            "throughput_ratio": nothing, "step_time_ratio": nothing, "efficiency_ratio": nothing,
            "verdict": NOT_COMPARABLE, "efficiency_verdict": "", "more_repeats": None,
            "differs": "; ".join(work)}


def compare_pair(reference, other, options):
    """Rows of the comparison of `other` against `reference`, one per key and N that both
    measured; a pair of series that differ in workload gives rows without ratios, marked
    not comparable."""
    rows = []
    for key in sorted(set(reference.by_key) & set(other.by_key)):
        a, b = reference.by_key[key], other.by_key[key]
        sizes = sorted({r.world_size for r in a.runs} & {r.world_size for r in b.runs})
        if not sizes:
            continue
        shared_a = [run for n in sizes for run in _runs_at(a, n)]
        shared_b = [run for n in sizes for run in _runs_at(b, n)]
        work = workload_differences(shared_a, shared_b)
        if work:
            rows += [_not_comparable_row(reference, other, key, n, work, options["level"]) for n in sizes]
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
    """Rows with every Ratio spread into its estimate and its bootstrap confidence
    interval's ends (_ci_lo, _ci_hi)."""
    flat = []
    for row in rows:
        out = {k: v for k, v in row.items() if k not in RATIO_COLUMNS}
        for column in RATIO_COLUMNS:
            ratio = row[column]
            out[column] = ratio.estimate
            out[f"{column}_ci_lo"] = ratio.low
            out[f"{column}_ci_hi"] = ratio.high
        out["level"] = row["throughput_ratio"].level
        flat.append(out)
    return flat


def comparison_table(rows):
    """The Markdown table of the compared points: one line per row, with the ratios B/A, their
    intervals, the verdicts and the repeats that would decide."""
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


def not_comparable_lines(rows):
    """One line per pair of series that measured different work."""
    lines = {}
    for row in rows:
        if row["verdict"] == NOT_COMPARABLE:
            key = f"{row['model']} {row['scaling']} {row['strategy']}"
            lines.setdefault(key, f"- {key}: {NOT_COMPARABLE}, different work ({row['differs']}); "
                                  "no ratio or verdict")
    return list(lines.values())


def unmatched_lines(reference, other):
    """Markdown list lines for the keys measured in only one of the two sets, and for keys
    that several series of one set share, which are not compared."""
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


PANELS = (("throughput_ratio", "throughput B/A"), ("step_time_ratio", "step time B/A"),
          ("efficiency_ratio", "efficiency B/A (each against its N0)"))

METHOD = """\
- Sets are paired by (model, scaling, strategy with overlap, N); each other set is
  compared with the first, A. Ratios are B over A: throughput above 1, step time below
  1 and efficiency above 1 mean B is better.
- **Interval**: a {level:.0%} percentile bootstrap, {resamples} resamples, seed {seed}.
  Each resample draws the runs (repeats) of a point with replacement and, inside each
  drawn run, its measured steps with replacement, and takes the median step over all
  drawn steps; A and B are drawn independently. Throughput is median tokens per step over
  the median step, so its interval is the step time's, inverted. Efficiency is each
  set's throughput at N over its throughput at N0 (the smallest N both sets measured),
  times N0/N; its interval draws the four points.
- **Verdict** (on throughput; the efficiency verdict is the same rule on efficiency): *no
  difference* when the whole interval lies within ±{threshold:.1%} of 1 (so the sets agree
  to that band at the {level:.0%} level); *faster* or *slower* when the interval excludes
  1 and leaves that band; *undecided* otherwise.
- **To decide**: for an undecided point, about how many more repeats of each set would
  narrow the interval enough to decide, assuming its width shrinks as 1/√repeats and the
  estimate stays where it is. A point with one repeat has an interval over its steps
  only: run-to-run variation is not in it."""


def _slug(text):
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def plot_ratios(rows, out_dir, name, title, threshold):
    """Three panels against N, one line per (model, scaling, strategy), each point with its
    interval; the band of no difference shaded."""
    figure, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.2))
    lines = {}
    for row in rows:
        lines.setdefault((row["model"], row["scaling"], row["strategy"]), []).append(row)
    sizes = [row["N"] for row in rows]
    for axis, (column, label) in zip(axes, PANELS):
        axis.axhspan(1.0 / (1.0 + threshold), 1.0 + threshold, color="#DDDDDD", alpha=0.6,
                     label=f"±{threshold:.0%}: no difference")
        axis.axhline(1.0, color="black", linewidth=0.8)
        for key, points in sorted(lines.items()):
            points = [p for p in points if math.isfinite(p[column].estimate)]
            if not points:
                continue
            n = np.array([p["N"] for p in points], dtype=float)
            estimate = np.array([p[column].estimate for p in points])
            low = np.array([p[column].low for p in points])
            high = np.array([p[column].high for p in points])
            axis.errorbar(n, estimate, yerr=[estimate - low, high - estimate], marker="o",
                          capsize=3, label=" ".join(key))
        world_size_axis(axis, sizes)
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    legend_outside(axes[-1])
    figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    figure.savefig(out_dir / name, dpi=DPI)
    plt.close(figure)
    return name


def _set_line(result):
    used = [run for run in result.runs if run.usable]
    return (f"- **{result.label}**: `{result.path}`; {len(used)} runs used of "
            f"{len(result.runs)} files, {len(result.series)} series"
            + (f", {len(result.problems)} problems (see its own report)" if result.problems
               else ""))


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.generic):
        return _json_value(value.item())
    return value


def write_compare(paths, out_dir, labels=None, **options):
    """Compares every set with the first; returns the path of compare.md."""
    options = {**DEFAULTS, **{k: v for k, v in options.items() if v is not None}}
    labels = labels or default_labels(paths)
    sets = [load_set(label, path) for label, path in zip(labels, paths)]
    out_dir.mkdir(parents=True, exist_ok=True)
    reference = sets[0]
    parts = ["# scalestudy comparison", "",
             f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')} by "
             f"scalestudy-analysis {__version__}. Every row: `compare.csv` and `compare.json`.",
             "", "## Sets", ""] + [_set_line(result) for result in sets] + [
             "", "## Method", "", METHOD.format(**options), ""]
    all_rows = []
    for other in sets[1:]:
        pair_rows = compare_pair(reference, other, options)
        all_rows += pair_rows
        rows = [row for row in pair_rows if row["verdict"] != NOT_COMPARABLE]
        parts += [f"## {other.label} against {reference.label}", ""]
        if rows:
            counts = pd.Series([row["verdict"] for row in rows]).value_counts()
            parts += ["Verdicts on throughput: " + ", ".join(
                f"{count} {verdict}" for verdict, count in counts.items()) + ".", "",
                      comparison_table(rows), ""]
            name = plot_ratios(rows, out_dir, f"compare_{_slug(other.label)}.png",
                               f"{other.label} against {reference.label} (B/A, "
                               f"{options['level']:.0%} bootstrap intervals)",
                               options["threshold"])
            parts += [f"![Ratios of {other.label} to {reference.label} against N]({name})", ""]
        else:
            parts += ["No (model, scaling, strategy, N) of the same work was measured in both sets.", ""]
        unmatched = not_comparable_lines(pair_rows) + unmatched_lines(reference, other)
        if unmatched:
            parts += ["Not compared:", ""] + unmatched + [""]
    flat = flat_rows(all_rows)
    pd.DataFrame(flat).to_csv(out_dir / "compare.csv", index=False)
    (out_dir / "compare.json").write_text(json.dumps(
        {"options": options, "sets": [{"label": s.label, "path": relative(s.path, out_dir)}
                                      for s in sets],
         "rows": [{k: _json_value(v) for k, v in row.items()} for row in flat]}, indent=1),
        encoding="utf-8")
    report = out_dir / "compare.md"
    report.write_text("\n".join(parts) + "\n", encoding="utf-8")
    write_html(report)
    return report


def default_labels(paths):
    """The folders' names, or A, B, C... where two names are the same."""
    names = [str(path).rstrip("/").rsplit("/", 1)[-1] or str(path) for path in paths]
    if len(set(names)) == len(names):
        return names
    return [chr(ord("A") + index) for index in range(len(paths))]

