"""The markdown report and runs.csv: what was loaded, per-series tables and figures, and
every problem found on the way."""
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from . import __version__, plots
from .kernel_report import kernel_section
from .load import load_results
from .markdown import (figure_markdown as _figure_markdown, fmt as _fmt, percent as _percent,
                       relative as _relative, table as _table)
from .metrics import group_series
from .timeline import timeline

DEFINITIONS = """\
- **Step time** of a step: the longest `step` phase over all ranks. Warm-up steps, and
  the traced steps of a kernel profile, are excluded. Values are medians over all
  measured steps of all repeats at one N, with the interquartile range [q1–q3] as the
  spread (the band in the plots).
- **Throughput**: median tokens per step / median step time.
- **Speedup** S(N) = throughput(N) / throughput(N0), with N0 the smallest N measured in
  the series; for strong scaling this is T(N0) / T(N). **Efficiency** = S(N) · N0 / N;
  for weak scaling it is tokens/s per rank at N over tokens/s per rank at N0.
- **Karp–Flatt** serial fraction e = (1/S − 1/p) / (1 − 1/p) with p = N / N0 (strong
  scaling, N > N0).
- **Communication time** of a step: the union of the rank's collective intervals, the
  maximum over ranks. **Exposed** communication: the part of that union not covered by
  the forward, backward and optimizer intervals, less the times compute sat blocked
  waiting for a collective inside them; maximum over ranks. The exposed fraction is
  median exposed / median communication time (0 without communication).
- **Breakdown**: mean per-step time on the slowest rank of each step, split into compute
  (forward ∪ backward), optimizer (outside compute), exposed communication, and other
  (the rest of the step: data loading, waiting).
- **Compute spread**: per step, the slowest rank's own compute time (forward ∪ backward,
  less the time blocked in it waiting for collectives) over the fastest rank's, minus 1;
  the median over measured steps. Devices of unequal speed show here, and a
  data-parallel step waits for the slowest.
- **MFU**: model TFLOP/s per GPU (FLOPs per step / median step time / N) over the peak
  rate recorded in the file."""


def _series_table(series):
    strong = series.scaling == "strong"
    header = ["N", "repeats", "steps", "step time median [IQR] (s)", "tokens/s",
              "speedup" if strong else "throughput ratio", "efficiency",
              "Karp–Flatt", "exposed comm fraction", "comm / step", "MFU"]
    rows = []
    for _, point in series.table.iterrows():
        rows.append([
            str(int(point["N"])), str(int(point["repeats"])), str(int(point["steps"])),
            f"{_fmt(point['step_time_median_s'])} [{_fmt(point['step_time_q1_s'])}–"
            f"{_fmt(point['step_time_q3_s'])}]",
            _fmt(point["tokens_per_s"]), _fmt(point["speedup"]), _fmt(point["efficiency"]),
            _fmt(point["karp_flatt"]) if strong else "—",
            _percent(point["exposed_comm_fraction"]), _percent(point["comm_fraction_of_step"]),
            _percent(point["mfu"]),
        ])
    return _table(header, rows)


def _breakdown_table(series):
    header = ["N", "step (ms)", "compute (ms)", "exposed comm (ms)", "optimizer (ms)",
              "other (ms)", "compute spread over ranks"]
    rows = [[str(int(p["N"]))] + [_fmt(1e3 * p[c]) for c in
            ("step_time_mean_s", "compute_mean_s", "exposed_comm_mean_s", "optimizer_mean_s",
             "other_mean_s")] + [_percent(p["compute_spread"]) if p["N"] > 1 else "—"]
            for _, p in series.table.iterrows()]
    return _table(header, rows)


def _loaded_section(results_dir, runs, series_list):
    used = [run for run in runs if run.usable]
    statuses = Counter(run.status for run in runs)
    shas = Counter(run.git_sha for run in used)
    hosts = sorted({str(h) for run in used for h in run.hostnames})
    devices = Counter(str(d) for run in used for d in run.devices)
    backends = Counter(str(run.attrs.get("backend")) for run in used)
    lines = [
        f"- Results directory: `{results_dir}`",
        f"- Result files found: {len(runs)} "
        f"({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))})",
        f"- Runs used: {len(used)}; left out: {len(runs) - len(used)} (see Problems)",
        f"- Series: {len(series_list)}",
        "- git shas of the runs used: " + (", ".join(f"`{sha}` ({n} runs)"
                                               for sha, n in sorted(shas.items())) or "none"),
        f"- Hosts ({len(hosts)}): " + (", ".join(f"`{h}`" for h in hosts[:20])
                                      + (" ..." if len(hosts) > 20 else "") or "none"),
        "- Devices (rank count): " + (", ".join(f"{d} ({n})" for d, n in
                                               sorted(devices.items())) or "none"),
        "- Backends: " + (", ".join(f"{b} ({n} runs)" for b, n in sorted(backends.items()))
                          or "none"),
    ]
    return "\n".join(lines)


def _series_section(series, figures, results_dir):
    baseline = series.baseline_n
    sizes = ", ".join(str(int(n)) for n in series.table["N"])
    example = series.runs[0]
    shared = {key: value for key, value in sorted(example.config.items())
              if key in ("layers", "hidden", "heads", "vocab", "steps", "warmup_steps")}
    parts = [
        f"### {series.index}. {series.label}",
        "",
        f"- Baseline N0 = {baseline} (the smallest world size measured); N measured: {sizes}",
        f"- Runs: {len(series.runs)}; git sha `{example.git_sha}`; model shape "
        + ", ".join(f"{k}={v}" for k, v in shared.items()),
        "",
        _series_table(series),
        "",
        "Mean time per step, slowest rank:",
        "",
        _breakdown_table(series),
        "",
    ]
    if len(series.table) == 1:
        parts += ["*Only one world size was measured, so there is no scaling to show.*", ""]
    for figure in figures:
        if figure.note.startswith("from "):
            figure.note = f"from `{_relative(figure.note[5:], results_dir)}`"
        parts += [_figure_markdown(figure), ""]
    return "\n".join(parts)


def _csv_frame(frame):
    frame = frame.copy()
    if "step_times_s" in frame:
        frame["step_times_s"] = [" ".join(f"{t:.9g}" for t in times)
                                 for times in frame["step_times_s"]]
    return frame


def write_report(results_dir, out_dir):
    """Loads results_dir, writes report.md, runs.csv and the PNGs into out_dir. Returns
    the report path. The caller has checked that result files exist."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs, frame, problems = load_results(results_dir)
    series_list, series_problems = group_series(runs)
    problems = problems + series_problems
    _csv_frame(frame).to_csv(out_dir / "runs.csv", index=False)

    overview = plots.overview_figures(series_list, out_dir)
    sections = [
        "# scalestudy scaling report",
        "",
        f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')} by "
        f"scalestudy-analysis {__version__}. One row per run: `runs.csv`.",
        "",
        "## What was loaded",
        "",
        _loaded_section(results_dir, runs, series_list),
        "",
        "## Definitions",
        "",
        DEFINITIONS,
        "",
        "## Overview",
        "",
        "\n\n".join(_figure_markdown(figure) for figure in overview),
        "",
        "## Series",
        "",
    ]
    if not series_list:
        sections += ["No usable runs: every file was left out (see Problems).", ""]
    for series in series_list:
        figures = [plots.breakdown(series, out_dir), timeline(series, out_dir)]
        sections += [_series_section(series, figures, results_dir), ""]
    kernels = kernel_section(series_list, runs, out_dir, results_dir)
    if kernels is not None:
        sections += [kernels, ""]
    sections += ["## Problems", ""]
    if problems:
        sections += [f"- {replace(p, where=_relative(p.where, results_dir)).line()}"
                     for p in problems]
    else:
        sections += ["None: every file was complete, readable and consistent."]
    report = out_dir / "report.md"
    report.write_text("\n".join(sections) + "\n", encoding="utf-8")
    return report
