"""compare.md, compare.csv, compare.json and the ratio figures of `scalestudy-report
compare`."""
import json
import math
import re
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from . import __version__  # noqa: E402
from .compare import (DEFAULTS, compare_pair, comparison_table, flat_rows,  # noqa: E402
                      load_set, unmatched_lines)
from .html import write_html  # noqa: E402
from .markdown import relative  # noqa: E402
from .plots import DPI, _legend_outside, _world_size_axis  # noqa: E402

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
        _world_size_axis(axis, sizes)
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
    _legend_outside(axes[-1])
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
        rows = compare_pair(reference, other, options)
        all_rows += rows
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
            parts += ["No (model, scaling, strategy, N) was measured in both sets.", ""]
        unmatched = unmatched_lines(reference, other)
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

