"""The markdown report: what was loaded, what sets the series apart (what
each ran on and what built it, and the names of whatever differs between them, so that a
reader comparing two series sees first whether they differ in more than the strategy),
per-series tables and figures with memory per rank by kind, loss against step beside the
1-rank run and the collectives' achieved bandwidth, and every problem found on the way;
the sections of their own (GPU state, kernel profile) come from their modules, and the
tables for other tools from exports."""
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from scalestudy_analysis import __version__

from scalestudy_analysis.results import machine

from scalestudy_analysis.report import noise

from scalestudy_analysis.report import plots
from scalestudy_analysis.report.gpu_section import gpu_state_section
from scalestudy_analysis.report.exports import write_exports
from scalestudy_analysis.render.html import write_html
from scalestudy_analysis.bench.kernels import kernel_section
from scalestudy_analysis.report.bandwidth import bandwidth_figure, bandwidth_markdown, bandwidth_table, load_benches
from scalestudy_analysis.results.baseline import add_common_efficiency
from scalestudy_analysis.results.load import load_results
from scalestudy_analysis.report.loss import departure_line, loss_figure
from scalestudy_analysis.render.markdown import (figure_markdown as _figure_markdown, fmt as _fmt, percent as _percent,
                       relative as _relative, table as _table)
from scalestudy_analysis.report.memory import memory_figures, memory_markdown, memory_table
from scalestudy_analysis.results.metrics import comm_part_name, group_series, series_peak
from scalestudy_analysis.report.scaling_loss import loss_figures, loss_table
from scalestudy_analysis.report.timeline import timeline
from scalestudy_analysis.report.trace import series_trace
from scalestudy_analysis.report.verdict import summary_section

SCALING_LOSS_INTRO = """\
Each series' median step at N against the ideal, T(N0)·N0/N for strong scaling and T(N0)
for weak, and the difference split over the breakdown's parts: a part's median at N less
its median at N0 scaled as the ideal is. Shares are of the step at N, so they add up to
1 − efficiency; "unexplained" is what the parts' medians leave of the median step."""

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
  median exposed / median communication time; "—" at N = 1 and without communication,
  where nothing is exchanged (the file's `/summary` stores 0 there).
- **Breakdown**: each measured step of the slowest rank cut into disjoint parts that
  add up to the step: **compute**, forward ∪ backward less the time blocked in them
  waiting for a collective; **optimizer**, the optimizer outside those, less its waits;
  **exposed communication**, collectives running while neither computes (the exposed
  communication above, on that rank); **data**, the data phase outside all of these;
  **other**, the rest (waits with no collective running, host gaps). Bars and table give
  each part's median over the measured steps with its IQR; the medians' sum is set
  beside the median step, and a sum more than 1 % away is listed under Warnings.
- **Link** of a point: how its ranks exchanged data. On cuda, the transports NCCL
  connected them through, as its log named them when the run started (`P2P`: NVLink or
  PCIe; `SHM`: host memory; `NET/Socket`, `NET/IB`: the network; `NVLS`: NVLink SHARP);
  "unknown" where the file does not say. A run of `--link-emulation socket` is
  "emulated inter-node": its GPUs share one host and NCCL's network transport carries
  their data over the loopback interface, so it stands for a run across nodes, never
  for one over the host's NVLink. Series of different emulation settings are never
  pooled.
- **Intra-node / inter-node comm**: every collective runs over all ranks, so a point's
  communication is inter-node where its ranks span more than one node (or an emulation
  stands in for separate nodes) and intra-node otherwise; the breakdown's
  "communication" column names it.
- **Compute spread**: per step, the slowest rank's own compute time (forward ∪ backward,
  less the time blocked in it waiting for collectives) over the fastest rank's, minus 1;
  the median over measured steps. Devices of unequal speed show here, and a
  data-parallel step waits for the slowest.
- **MFU**: model TFLOP/s per GPU (FLOPs per step / median step time / N) over the peak
  rate recorded in the files: the median of the series' runs, which is every run's on
  CUDA (a datasheet rate) and varies on the CPU (a rate each run measures; the series'
  section names the spread)."""

def _series_table(series):
    strong = series.scaling == "strong"
    common = np.isfinite(series.table["efficiency_common"]).any()
    header = ["N", "nodes×ranks per node", "link", "repeats", "steps", "step time median [IQR] (ms)", "tokens/s",
              "speedup" if strong else "throughput ratio", "efficiency",
              "Karp–Flatt", "exposed comm fraction", "comm / step", "MFU"]
    header += ["efficiency vs baseline [IQR]"] if common else []
    rows = []
    for _, point in series.table.iterrows():
        extra = [f"{_fmt(point['efficiency_common'])} [{_fmt(point['efficiency_common_q1'])}–"
                 f"{_fmt(point['efficiency_common_q3'])}]"] if common else []
        rows.append([
            str(int(point["N"])), str(point["topology"]), str(point["link"]), str(int(point["repeats"])),
            str(int(point["steps"])),
            # Milliseconds, as in the breakdown's table below.
            f"{_fmt(1e3 * point['step_time_median_s'])} [{_fmt(1e3 * point['step_time_q1_s'])}–"
            f"{_fmt(1e3 * point['step_time_q3_s'])}]",
            _fmt(point["tokens_per_s"]), _fmt(point["speedup"]), _fmt(point["efficiency"]),
            _fmt(point["karp_flatt"]) if strong else "—",
            _percent(point["exposed_comm_fraction"]), _percent(point["comm_fraction_of_step"]),
            _percent(point["mfu"]),
        ] + extra)
    return _table(header, rows)


def _breakdown_table(series):
    header = ["N", "step (ms)", "communication"] + [
        f"{part.replace('_comm', ' comm')} (ms)" for part, _, _ in plots.BREAKDOWN_PARTS] + [
        "sum of parts (ms)", "sum vs step", "compute spread over ranks"]
    rows = []
    for _, p in series.table.iterrows():
        # Whether the point's exposed communication crossed nodes (or an emulation of it).
        scope = str(p["comm_scope"])
        communication = " / ".join(comm_part_name(part) for part in scope.split(" / ")) if scope != "—" else "—"
        cells = [f"{_fmt(1e3 * p[f'breakdown_{part}_median_s'])} "
                 f"[{_fmt(1e3 * p[f'breakdown_{part}_q1_s'])}–"
                 f"{_fmt(1e3 * p[f'breakdown_{part}_q3_s'])}]"
                 for part, _, _ in plots.BREAKDOWN_PARTS]
        rows.append([str(int(p["N"])), _fmt(1e3 * p["step_time_median_s"]), communication] + cells + [
            _fmt(1e3 * p["breakdown_median_sum_s"]), f"{100 * p['breakdown_sum_error']:+.2f} %",
            _percent(p["compute_spread"]) if p["N"] > 1 else "—"])
    return _table(header, rows)


def _loaded_section(results_dir, runs, series_list):
    used = [run for run in runs if run.usable]
    statuses = Counter(run.status for run in runs)
    shas = Counter(run.git_sha for run in used)
    hosts = sorted({str(h) for run in used for h in run.hostnames})
    devices = Counter(str(d) for run in used for d in run.devices)
    backends = Counter(str(run.attrs.get("backend")) for run in used)
    topologies = Counter((machine.nodes(run), machine.ranks_per_node(run)) for run in used)
    links = Counter(machine.link_kind(run) for run in used if machine.link_kind(run) is not None)
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
        "- Runs by nodes × ranks per node: " + (", ".join(
            f"{machine.topology_words(*shape)} ({n})" for shape, n in sorted(topologies.items()))
            or "none"),
        "- Links between ranks (runs): " + (", ".join(f"{kind} ({n})" for kind, n in sorted(links.items()))
                                             or "none (one rank)"),
        "- Devices (rank count): " + (", ".join(f"{d} ({n})" for d, n in
                                               sorted(devices.items())) or "none"),
        "- Backends: " + (", ".join(f"{b} ({n} runs)" for b, n in sorted(backends.items()))
                          or "none"),
    ]
    return "\n".join(lines)


# Columns of the list of series ("What sets the series apart"): (heading, value of a
# series), in display order.
OVERVIEW_COLUMNS = (
    ("device", lambda s: _distinct(s, machine.device_model)),
    ("nodes×ranks per node (by N)", lambda s: _topologies(s)),
    ("backend", lambda s: _distinct(s, lambda r: str(r.attrs.get("backend", machine.UNKNOWN)))),
    ("precision", lambda s: str(s.fields.get("precision", machine.UNKNOWN))),
    ("build", lambda s: _distinct(s, machine.build)),
    ("CPU model", lambda s: _distinct(s, machine.cpu_model)),
    ("logical cores", lambda s: _distinct(s, machine.logical_cores)),
)
# Shown only where some series runs on the CPU backend: there they are the device.
CPU_COLUMNS = ("CPU model", "logical cores")


def _distinct(series, value_of):
    return " + ".join(sorted({str(value_of(run)) for run in series.runs}))


def _topologies(series):
    by_n = {}
    for run in sorted(series.runs, key=lambda r: r.world_size):
        by_n.setdefault(run.world_size, set()).add(machine.topology(run))
    return ", ".join(f"{n}: {' / '.join(sorted(shapes))}" for n, shapes in by_n.items())


def differing_columns(series_list):
    """Headings of the columns whose value is not the same for every series (the
    topology compared by its ranks per node, since N changes the node count)."""
    differing = []
    for heading, value_of in OVERVIEW_COLUMNS:
        if heading.startswith("nodes"):
            values = {run_packing for s in series_list
                      for run_packing in {machine.packing(run) or "1 node" for run in s.runs}}
            if len(values - {"1 node"}) > 1:
                differing.append(heading)
            continue
        if len({value_of(s) for s in series_list}) > 1:
            differing.append(heading)
    return differing


def overview_section(series_list):
    """The overview's Markdown: one row per series with its machine, build and configuration,
    and which of them differ; the CPU columns only when a series ran on the CPU."""
    if not series_list:
        return "No series."
    with_cpu = any(str(run.attrs.get("backend")) == "cpu" for s in series_list for run in s.runs)
    columns = [(h, f) for h, f in OVERVIEW_COLUMNS if with_cpu or h not in CPU_COLUMNS]
    differing = [h for h in differing_columns(series_list) if with_cpu or h not in CPU_COLUMNS]
    rows = [[str(s.index), f"{s.strategy_label} {s.scaling}"] + [f(s) for _, f in columns]
            for s in series_list]
    lines = ["Runs that differ in device, topology (ranks per node), backend, precision, "
             "build (commit and dirty flag) or, on the CPU backend, CPU model and logical "
             "cores are never pooled: each such difference makes a series of its own.", ""]
    if differing:
        lines.append("**Differs between series:** " + ", ".join(differing) + ".")
    else:
        lines.append("Every series ran on the same kind of machine, from the same build.")
    lines += ["", _table(["#", "series"] + [h for h, _ in columns], rows)]
    return "\n".join(lines)


@dataclass
class SeriesDetails:
    """What a series' section shows beyond its scaling table and breakdown; the numbers
    are kept for the warnings and the exports."""
    memory: pd.DataFrame
    bandwidth: pd.DataFrame
    loss_departure: dict                 # N -> largest relative departure from 1 rank
    figures: list = field(default_factory=list)

    def markdown(self, series):
        sources = sorted({run.peak_bytes_source for run in series.runs if run.peak_bytes_source})
        loss, bandwidth = self.figures
        parts = ["#### Memory per rank", "", memory_markdown(self.memory, ", ".join(sources)), "",
                 "#### Loss", "", _figure_markdown(loss), ""]
        line = departure_line(series, self.loss_departure)
        if line:
            parts += [line, ""]
        parts += ["#### Collectives' bandwidth", "", bandwidth_markdown(self.bandwidth), "",
                  _figure_markdown(bandwidth), ""]
        return "\n".join(parts)


def series_details(series, series_list, out_dir, benches):
    """SeriesDetails of one series: memory and bandwidth tables (bench comm files beside),
    loss departures, and its loss and bandwidth figures, written under out_dir."""
    loss, departures = loss_figure(series, series_list, out_dir)
    bandwidth = bandwidth_table(series, benches)
    return SeriesDetails(memory=memory_table(series), bandwidth=bandwidth,
                         loss_departure=departures,
                         figures=[loss, bandwidth_figure(series, bandwidth, out_dir)])


def _series_section(series, figures, results_dir, details):
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
    ]
    peak, low, high = series_peak(series.runs)
    if np.isfinite(peak):
        sources = sorted({str(run.summary.get("peak_source", "")) for run in series.runs})
        spread = "" if low == high else f"; the runs measured {_fmt(low)} to {_fmt(high)}"
        parts.append(f"- MFU's peak: {_fmt(peak)} TFLOP/s per device ({'; '.join(sources)})"
                     f"{spread}")
    if np.isfinite(series.table["efficiency_common"]).any():
        parts.append(f"- Efficiency vs baseline: against series "
                     f"{int(series.table['baseline_series'].iloc[0])} at N0 = "
                     f"{int(series.table['baseline_n'].iloc[0])} (`--baseline`)")
    parts += [
        "",
        _series_table(series),
        "",
        "Median time per step on the slowest rank, by part [IQR]:",
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
    parts += [details.markdown(series)]
    return "\n".join(parts)


def write_report(results_dir, out_dir, baseline=None, bench_files=()):
    """Loads results_dir, writes report.md, runs.csv, the PNGs and the sections' CSVs into
    out_dir. Returns the report path. The caller has checked that result files exist.
    baseline: a --baseline SERIES spec (baseline.resolve); BaselineError when it matches
    no series, before anything is written. bench_files: `scalestudy bench comm` files
    whose bus bandwidth is set beside the collectives'."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    runs, frame, problems = load_results(results_dir)
    series_list, series_problems = group_series(runs)
    baselines = add_common_efficiency(series_list, baseline)
    benches, bench_problems = load_benches(bench_files)
    problems = problems + series_problems + bench_problems
    out_dir.mkdir(parents=True, exist_ok=True)

    overview = plots.overview_figures(series_list, out_dir)
    headline = {figure.file.split("_", 1)[0]: figure
                for figure in plots.common_efficiency(series_list, out_dir, baselines)}
    details = {s.index: series_details(s, series_list, out_dir, benches) for s in series_list}
    flags = noise.collect(series_list, details)
    exported = write_exports(runs, frame, series_list, details, results_dir, out_dir)
    sections = [
        "# scalestudy scaling report",
        "",
        f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')} by "
        f"scalestudy-analysis {__version__}. One row per run: `runs.csv`; per step: "
        f"{' and '.join(f'`{name}`' for name in exported if name.startswith('steps'))}; one "
        "per series and N: `series.csv` and `series.json` (their columns and units: "
        "docs/exports.md).",
        "",
        "## Summary",
        "",
        summary_section(series_list, baselines, bool(baseline), headline),
        "",
        "## Warnings",
        "",
        noise.warnings_section(flags),
        "",
        "## Where the scaling went",
        "",
        SCALING_LOSS_INTRO,
        "",
        loss_table(series_list),
        "",
        "\n\n".join(_figure_markdown(figure) for figure in loss_figures(series_list, out_dir)),
        "",
        "## What was loaded",
        "",
        _loaded_section(results_dir, runs, series_list),
        f"- Warnings: {len(flags)} (see Warnings); problems: {len(problems)} (see Problems)",
        "",
        "## What sets the series apart",
        "",
        overview_section(series_list),
        "",
    ]
    if noise.has_cpu_series(series_list):
        sections += ["## What a CPU study can show", "", noise.CPU_STUDY, ""]
    sections += [
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
        drawn = timeline(series, out_dir)
        trace = series_trace(series, out_dir)
        drawn = replace(drawn, note=f"{drawn.note}; every step of that run, for Perfetto "
                                    f"(ui.perfetto.dev) or chrome://tracing: [{trace}]({trace})")
        figures = [plots.breakdown(series, out_dir), drawn]
        sections += [_series_section(series, figures, results_dir, details[series.index]), ""]
    memory_figures_ = memory_figures(series_list, {i: d.memory for i, d in details.items()},
                                     out_dir)
    if memory_figures_:
        sections += ["## Memory per rank by strategy", "",
                     "\n\n".join(_figure_markdown(figure) for figure in memory_figures_), ""]
    sections += [gpu_state_section(series_list, runs, out_dir, results_dir), ""]
    kernels = kernel_section(series_list, runs, out_dir, results_dir)
    if kernels is not None:
        sections += [kernels, ""]
    sections += ["## Problems", ""]
    if problems:
        sections += [f"- {replace(p, where=_relative(p.where, results_dir)).line()}"
                     for p in problems]
    else:
        sections += ["None: every file was complete, readable and consistent."]
    sections += ["", "## Appendix: definitions", "", DEFINITIONS]
    report = out_dir / "report.md"
    report.write_text("\n".join(sections) + "\n", encoding="utf-8")
    write_html(report)
    return report
