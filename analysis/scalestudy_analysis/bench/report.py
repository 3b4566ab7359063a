"""Benchmark files of `scalestudy bench` (docs/results-schema.md, "Benchmark files"):
tables like the seed notebook's and a roofline.

    scalestudy-bench-report BENCH_FILES... -o OUT_DIR [--runs RESULTS_DIR] [--pytorch FILE.json]

writes OUT_DIR/bench-report.md, one CSV of points per benchmark, roofline*.png, the
inference grid of each inference file (bench/inference_grid.py, with PyTorch's points beside it
from --pytorch) and each layer file against its device's roofline (bench/layer_roofline.py). The
rates in the files are recomputed from the stored times and FLOP/byte counts; a
disagreement, a failed or unfinished file, or a wrong collective result is listed under
Problems, never averaged in.

Roofline: per device, the compute roof is the best measured GEMM rate (any precision;
the fp32 GEMM rate is drawn dashed when it is lower) and the bandwidth roof the best
measured elementwise rate. Points sit at their arithmetic intensity, FLOPs per byte moved,
with the byte model of src/bench/bench_model.h: every tensor an op of the op interface
reads is read once, every tensor it writes written once, accumulated tensors read and
written, fp32, with the MLP's GELU inside the dense layers around it. The same model (gpt_forward_bytes, gpt_backward_bytes below) places the
forward and backward phases of training runs given with --runs.
"""
import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from scalestudy_analysis.results import machine
from scalestudy_analysis.bench.inference_grid import inference_section, read_pytorch
from scalestudy_analysis.bench.layer_roofline import layer_section
from scalestudy_analysis.results.reading import Problem
from scalestudy_analysis.results.schema import COMM_SCOPES, SUPPORTED_SCHEMA_VERSIONS

USAGE_ERROR = 2
BENCH_NAMES = ("gemm", "bandwidth", "layer", "inference", "comm")
COMMON_COLUMNS = ("status", "detail", "time_median_s", "time_q1_s", "time_q3_s", "calls_per_sample")
COLUMNS = {
    "gemm": ("precision", "n", "flops", "bytes", "arithmetic_intensity", "tflops"),
    "bandwidth": ("kernel", "elems", "bytes", "flops", "arithmetic_intensity", "gb_per_s"),
    "layer": ("part", "pass", "batch", "seq", "flops", "bytes", "arithmetic_intensity", "tflops",
              "memory_bytes"),
    "inference": ("batch", "seq", "flops", "bytes", "arithmetic_intensity", "latency_ms",
                  "sequences_per_s", "tokens_per_s", "tflops", "memory_bytes"),
    "comm": ("collective", "bytes", "elems", "algbw_gb_per_s", "bus_factor", "busbw_gb_per_s",
             "wrong_elems"),
}
PRECISION_ORDER = ("fp32", "tf32", "fp16", "bf16")
STATUS_CELL = {"oom": "OOM", "unavailable": "n/a", "wrong": "WRONG"}
RATE_RTOL = 1e-6
A = 4.0  # bytes of an fp32 tensor element (and of an int32 token id)


def bus_factor(collective, world_size):
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md of NVIDIA/nccl-tests)."""
    n = float(world_size)
    return 2 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


def _recomputed(name, points):
    """The rates a file stores, recomputed from its times and counts."""
    t = points["time_median_s"]
    if name == "gemm" or name == "layer":
        return {"tflops": points["flops"] / t / 1e12}
    if name == "bandwidth":
        return {"gb_per_s": points["bytes"] / t / 1e9}
    if name == "inference":
        return {"tflops": points["flops"] / t / 1e12, "latency_ms": t * 1e3,
                "sequences_per_s": points["batch"] / t, "tokens_per_s": points["batch"] * points["seq"] / t}
    factor = pd.Series([bus_factor(c, n) for c, n in zip(points["collective"], points["ranks"])],
                       index=points.index)
    algbw = points["bytes"] / t / 1e9
    return {"bus_factor": factor, "algbw_gb_per_s": algbw, "busbw_gb_per_s": algbw * factor}


# ---- the byte model (src/bench/bench_model.cpp), for training phases -----------------------

def matmul_forward_bytes(rows, in_ch, out_ch, bias):
    """Bytes a matmul forward of rows × in_ch onto out_ch moves under the byte model (fp32):
    input, weight and bias read once, output written once."""
    return A * (rows * in_ch + out_ch * in_ch + (out_ch if bias else 0) + rows * out_ch)


def _input_gradient_passes(accumulate):
    """An accumulated input gradient is read and written; an overwritten one only written."""
    return 2 if accumulate else 1


def matmul_backward_bytes(rows, in_ch, out_ch, bias, accumulate_dinp):
    """Bytes a matmul backward moves under the byte model (fp32): dout, input and weight read;
    the input gradient written, and read too when accumulate_dinp; the weight and bias
    gradients accumulated."""
    return A * (rows * out_ch + rows * in_ch + out_ch * in_ch + _input_gradient_passes(accumulate_dinp) * rows * in_ch
                + 2 * out_ch * in_ch + (2 * out_ch if bias else 0))


def dense_gelu_forward_bytes(rows, in_ch, out_ch):
    """The dense layer with the GELU after it as one op: pre and out written, pre not read back."""
    return A * (rows * in_ch + out_ch * in_ch + out_ch + 2 * rows * out_ch)


def dense_backward_through_gelu_bytes(rows, in_ch, out_ch):
    """The next dense layer's backward through the GELU: dout, act, weight and pre read, dpre
    written, dweight and dbias accumulated; the gradient of act never reaches memory."""
    return A * (rows * out_ch + rows * in_ch + out_ch * in_ch + rows * in_ch + rows * in_ch
                + 2 * out_ch * in_ch + 2 * out_ch)


def gpt_forward_bytes(layers, hidden, heads, vocab, batch, seq):
    """Bytes one forward pass of a GPT of this shape moves under the byte model (fp32):
    embedding, `layers` blocks, final LayerNorm, logits and cross-entropy over batch × seq tokens."""
    n, c, b, t = batch * seq, hidden, batch, seq
    layernorm = A * (2 * n * c + 2 * c + 2 * n)
    attention = A * (4 * n * c + b * heads * t * t)
    # Each projection's GEMM adds the residual stream as it writes its result: one more read.
    block = (2 * layernorm + matmul_forward_bytes(n, c, 3 * c, True) + attention
             + matmul_forward_bytes(n, c, c, True) + dense_gelu_forward_bytes(n, c, 4 * c)
             + matmul_forward_bytes(n, 4 * c, c, True) + 2 * A * n * c)
    embedding = A * n + A * (2 * n * c + t * c)
    # The cross-entropy reads the logits once and writes the losses and the rows' max and 1/sum.
    head = layernorm + matmul_forward_bytes(n, c, vocab, False) + A * (n * vocab + 3 * n) + A * n
    return embedding + layers * block + head


def gpt_backward_bytes(layers, hidden, heads, vocab, batch, seq):
    """Bytes one backward pass of a GPT of this shape moves under the byte model (fp32), from
    the cross-entropy back to the embedding, over batch × seq tokens."""
    n, c, b, t = batch * seq, hidden, batch, seq

    def layernorm(accumulate):
        return A * ((2 + _input_gradient_passes(accumulate)) * n * c + 5 * c + 2 * n)

    # Every input gradient is overwritten by its one writer, except the residual stream's,
    # which the blocks' LayerNorm backwards accumulate. The cross-entropy backward reads the
    # logits and writes their gradient in place.
    head = (A * (2 * n * vocab + 2 * n) + A * n + matmul_backward_bytes(n, c, vocab, False, False)
            + layernorm(False))
    attention = A * (4 * n * c + b * heads * t * t + 3 * n * c)
    block = (dense_backward_through_gelu_bytes(n, 4 * c, c) + matmul_backward_bytes(n, c, 4 * c, True, False)
             + layernorm(True) + matmul_backward_bytes(n, c, c, True, False) + attention
             + matmul_backward_bytes(n, c, 3 * c, True, False) + layernorm(True))
    embedding = A * n + A * (3 * n * c + 2 * t * c)
    return head + layers * block + embedding


def forward_flops(layers, hidden, vocab, batch, seq):
    """src/model/flops.h: L·(24·b·s·h² + 4·b·s²·h) + 2·b·s·h·V."""
    b, s, h = batch, seq, hidden
    return layers * (24 * b * s * h * h + 4 * b * s * s * h) + 2 * b * s * h * vocab


# ---- reading ---------------------------------------------------------------------------------

@dataclass
class BenchFile:
    """One `scalestudy bench` file as read: root attributes, /method, its points as a
    DataFrame, devices and problems; usable is True once it read and its rates were checked."""
    path: str
    name: str = ""
    attrs: dict = field(default_factory=dict)
    method: dict = field(default_factory=dict)
    points: pd.DataFrame = None
    devices: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    usable: bool = False

    @property
    def device(self):
        return self.devices[0] if self.devices else "unknown"


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _read_group(handle, name, bench):
    group = handle[f"bench/{name}"]
    bench.method = {key: _text(value) for key, value in group.attrs.items()}
    columns = {}
    for key, dataset in group.items():
        if dataset.ndim != 1:
            continue
        columns[key] = (list(dataset.asstr()[()]) if dataset.dtype.kind in "OS" else dataset[()])
    missing = [c for c in COMMON_COLUMNS + COLUMNS[name] if c not in columns]
    if missing:
        raise KeyError(f"/bench/{name} lacks {', '.join(missing)}")
    points = pd.DataFrame(columns)
    if name == "comm" and "scope" not in points:
        # Before version 8 bench comm measured the world communicator only.
        world = int(bench.attrs.get("world_size", 1))
        points = points.assign(scope="world", ranks=world, groups=1)
    return points


def _check_rates(bench):
    points = bench.points
    ok = points["status"] != "oom"
    ok &= points["status"] != "unavailable"
    for column, values in _recomputed(bench.name, points).items():
        stored, computed = points.loc[ok, column].astype(float), values[ok].astype(float)
        bad = ~np.isclose(stored, computed, rtol=RATE_RTOL, atol=0.0)
        if bad.any():
            bench.problems.append(Problem(bench.path, "rate mismatch", f"{column} disagrees with its "
                                          f"recomputation in {int(bad.sum())} point(s); recomputed values used",
                                          False))
        points.loc[ok, column] = computed


def read_bench_file(path):
    """Reads one file; never raises for bad content (problems land in bench.problems)."""
    bench = BenchFile(path=str(path))
    try:
        with h5py.File(path, "r") as handle:
            bench.attrs = {key: _text(value) for key, value in handle.attrs.items()}
            bench.name = str(bench.attrs.get("bench", ""))
            if bench.name not in BENCH_NAMES:
                raise KeyError("not a benchmark file (no root attribute bench naming one of "
                               f"{', '.join(BENCH_NAMES)})")
            if int(bench.attrs.get("schema_version", -1)) not in SUPPORTED_SCHEMA_VERSIONS:
                raise KeyError(f"schema_version {bench.attrs.get('schema_version')}, this analysis reads "
                               + ", ".join(map(str, SUPPORTED_SCHEMA_VERSIONS)))
            status = bench.attrs.get("status", "")
            if status != "complete":
                reason = bench.attrs.get("failure_reason", "") or f"status {status!r}"
                bench.problems.append(Problem(bench.path, "failed" if status == "failed" else "incomplete",
                                              reason, True))
                return bench
            bench.devices = [str(d) for d in handle["ranks/device"].asstr()[()]]
            bench.points = _read_group(handle, bench.name, bench)
    except (OSError, KeyError, ValueError, TypeError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        bench.problems.append(Problem(bench.path, "unreadable", message.strip("'\""), True))
        return bench
    _check_rates(bench)
    wrong = bench.points["status"] == "wrong"
    if wrong.any():
        bench.problems.append(Problem(bench.path, "wrong results", f"{int(wrong.sum())} point(s) failed their "
                                      "result check; their rates are shown as WRONG", False))
    bench.usable = True
    return bench


# ---- tables ------------------------------------------------------------------------------------

def _cell(row, column, digits):
    if row["status"] in STATUS_CELL:
        return STATUS_CELL[row["status"]]
    value = row[column]
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def grid(points, index, columns, value, digits=4, column_order=None):
    """A pivot of cells with `digits` significant digits for ok points, OOM / n/a / WRONG
    otherwise."""
    frame = points.assign(cell=[_cell(row, value, digits) for _, row in points.iterrows()])
    table = frame.pivot_table(index=index, columns=columns, values="cell", aggfunc="first", sort=True)
    if column_order is not None:
        table = table[[c for c in column_order if c in table.columns]]
    return table.fillna("")


def _bytes_label(value):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value} B"


def bench_tables(bench):
    """(title, DataFrame of strings) pairs for one file, like the seed notebook's tables."""
    p = bench.points
    if bench.name == "gemm":
        return [("TFLOP/s of n×n×n GEMMs", grid(p, "n", "precision", "tflops", 4, PRECISION_ORDER))]
    if bench.name == "bandwidth":
        table = grid(p, "elems", "kernel", "gb_per_s", 4, ("copy", "accumulate"))
        table.index = [f"{e} ({_bytes_label(int(e) * 4)})" for e in table.index]
        return [("GB/s (bytes read + written) by elements per buffer", table)]
    if bench.name == "layer":
        # One table per part (the block first), batches down, seq and pass across; older
        # files hold their parts at one batch and seq only.
        tables = []
        parts = list(dict.fromkeys(p["part"]))
        for part in sorted(parts, key=lambda part: part != "block"):
            rows = p[p["part"] == part].sort_values(["seq", "pass"], kind="stable")
            rows = rows.assign(where="seq " + rows["seq"].astype(str) + ", " + rows["pass"])
            title = "Block" if part == "block" else f"{layer_part_kind(part).capitalize()} {part}:"
            tables.append((f"{title} TFLOP/s by batch", grid(rows, "batch", "where", "tflops", 4,
                                                           list(dict.fromkeys(rows["where"])))))
        return tables
    if bench.name == "inference":
        return [("Latency (ms) by batch × seq", grid(p, "batch", "seq", "latency_ms", 4)),
                ("Throughput (sequences/s) by batch × seq", grid(p, "batch", "seq", "sequences_per_s", 4))]
    return comm_tables(bench)


COLLECTIVE_ORDER = ("allreduce", "reduce_scatter", "allgather")
SCOPE_TITLES = {"world": "every rank", "intra_node": "intra-node (the ranks of each node)",
                "inter_node": "inter-node (one rank per node)"}


def comm_scopes(bench):
    """(scope, description) of every scope the file asked for, measured or absent; an
    older file's world alone."""
    asked = [s for s in str(bench.method.get("scopes", "world")).split(",") if s]
    return [(scope, str(bench.method.get(f"scope_{scope}", ""))) for scope in asked]


def comm_tables(bench):
    """Per measured scope its algbw and busbw by size; then busbw by size with the scopes
    side by side, intra- and inter-node beside the world."""
    p = bench.points
    link = machine.link_kind(bench) or "one rank"
    tables = []
    for scope, _ in comm_scopes(bench):
        rows = p[p["scope"] == scope]
        if rows.empty:
            continue
        frame = pd.concat([rows.assign(what=rows["collective"] + " algbw", value=rows["algbw_gb_per_s"]),
                           rows.assign(what=rows["collective"] + " busbw", value=rows["busbw_gb_per_s"])])
        order = [f"{c} {bw}" for c in COLLECTIVE_ORDER for bw in ("algbw", "busbw")]
        table = grid(frame, "bytes", "what", "value", 4, order)
        table["wrong elements"] = rows.groupby("bytes")["wrong_elems"].sum().astype(int).astype(str)
        table.index = [_bytes_label(int(b)) for b in table.index]
        ranks, groups = int(rows["ranks"].iloc[0]), int(rows["groups"].iloc[0])
        at_once = f", {groups} at once" if groups > 1 else ""
        tables.append((f"{SCOPE_TITLES.get(scope, scope)}: GB/s over {ranks} rank(s){at_once}, link {link}, "
                       "nccl-tests definitions", table))
    measured = [s for s in COMM_SCOPES if (p["scope"] == s).any()]
    if len(measured) > 1:
        frame = p[p["scope"].isin(measured)]
        frame = frame.assign(what=frame["collective"] + " " + frame["scope"])
        order = [f"{c} {s}" for c in COLLECTIVE_ORDER for s in measured]
        table = grid(frame, "bytes", "what", "busbw_gb_per_s", 4, order)
        table.index = [_bytes_label(int(b)) for b in table.index]
        tables.append(("busbw (GB/s) by size: " + ", ".join(SCOPE_TITLES[s] for s in measured), table))
    return tables


def comm_absent_lines(bench):
    """One line per scope asked for and not measured, with the file's reason."""
    return [f"- {SCOPE_TITLES.get(scope, scope)}: {description}" for scope, description in comm_scopes(bench)
            if description.startswith("absent")]


def markdown(table, index_name):
    """A Markdown table of a DataFrame, its index as the first column headed index_name;
    cells as str() writes them, so format the values first."""
    header = [index_name] + [str(c) for c in table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, row in table.iterrows():
        lines.append("| " + " | ".join([str(label)] + [str(v) for v in row]) + " |")
    return "\n".join(lines)


# ---- roofline ----------------------------------------------------------------------------------

@dataclass
class Roofline:
    """The roofline of one device: the compute roof (TFLOP/s) and the bandwidth roof (GB/s)
    with their sources, the best GEMM rate per precision, and the points placed against them."""
    device: str
    peak_tflops: float = math.nan
    peak_label: str = ""
    fp32_tflops: float = math.nan
    bandwidth_gbs: float = math.nan
    bandwidth_label: str = ""
    gemm_peaks: dict = field(default_factory=dict)  # precision -> (best TFLOP/s, label)
    points: list = field(default_factory=list)  # (group, label, intensity FLOP/byte, TFLOP/s)
    notes: list = field(default_factory=list)

    def roof(self, intensity):
        return np.minimum(self.peak_tflops, self.bandwidth_gbs * np.asarray(intensity) / 1e3)


def _ok(points):
    return points[points["status"] == "ok"]


def _add_bench_points(roofline, bench):
    rows = _ok(bench.points).to_dict("records")
    if bench.name == "gemm" and rows:
        best = max(rows, key=lambda r: r["tflops"])
        if not best["tflops"] <= roofline.peak_tflops:
            roofline.peak_tflops, roofline.peak_label = best["tflops"], f"gemm {best['precision']} n={best['n']}"
        for r in rows:
            if not r["tflops"] <= roofline.gemm_peaks.get(r["precision"], (math.nan,))[0]:
                roofline.gemm_peaks[r["precision"]] = (r["tflops"], f"gemm {r['precision']} n={r['n']}")
        fp32 = [r["tflops"] for r in rows if r["precision"] == "fp32"]
        if fp32:
            roofline.fp32_tflops = float(np.nanmax([roofline.fp32_tflops] + fp32))
        roofline.points += [("gemm", f"{r['precision']} n={r['n']}", r["arithmetic_intensity"], r["tflops"])
                            for r in rows]
    if bench.name == "bandwidth" and rows:
        # The largest buffers: smaller ones may sit in a cache, whose rate is not memory's.
        largest = max(r["elems"] for r in rows)
        best = max((r for r in rows if r["elems"] == largest), key=lambda r: r["gb_per_s"])
        if not best["gb_per_s"] <= roofline.bandwidth_gbs:
            roofline.bandwidth_gbs = best["gb_per_s"]
            roofline.bandwidth_label = f"{best['kernel']} of {best['elems']} elements, the largest size"
        with_flops = [r for r in rows if r["flops"] > 0]
        roofline.points += [("elementwise", r["kernel"], r["arithmetic_intensity"],
                             r["flops"] / r["time_median_s"] / 1e12) for r in with_flops]
        if len(with_flops) < len(rows):
            roofline.notes.append("copy does no FLOPs (intensity 0): it sets the bandwidth roof only")
    if bench.name == "layer":
        roofline.points += [(f"layer {layer_part_kind(r['part'])} ({r['pass']})",
                             f"{r['part']} b{r['batch']} s{r['seq']}", r["arithmetic_intensity"], r["tflops"])
                            for r in rows]
    if bench.name == "inference":
        roofline.points += [("inference forward", f"b{r['batch']} s{r['seq']}", r["arithmetic_intensity"],
                             r["tflops"]) for r in rows]


def layer_part_kind(part):
    """What a `bench layer` row times: the block (one layer's marginal time), a whole model
    (model-1-layer, model-2-layers), or a part of the block."""
    if part == "block":
        return "block"
    return "model" if part.startswith("model-") else "part"


def training_phase_points(runs_dir):
    """(device, group, label, intensity, TFLOP/s per rank) of the forward and backward phases
    of every usable run under runs_dir, and notes on the runs left out."""
    from scalestudy_analysis.results.load import find_result_files, read_run
    from scalestudy_analysis.results.schema import PHASE
    points, notes = [], []
    for path in find_result_files(runs_dir):
        run = read_run(path)
        if not run.usable:
            notes.append(f"{path}: not a usable run file, left out")
            continue
        c = run.config
        if c.get("grad_accum", "1") != "1" or c.get("precision", "fp32") != "fp32":
            notes.append(f"{path}: grad_accum {c.get('grad_accum')}, precision {c.get('precision')}: the phases "
                         "of one micro-batch in fp32 only are placed; left out")
            continue
        shape = [int(c[k]) for k in ("layers", "hidden", "heads", "vocab")]
        batch, seq = int(c["batch_per_rank"]), int(c["seq"])
        measured = run.intervals[run.measured]  # traced steps are slowed by the tracing
        flops = forward_flops(shape[0], shape[1], shape[3], batch, seq)
        phases = {"forward": (flops, gpt_forward_bytes(*shape, batch, seq)),
                  "backward": (2 * flops, gpt_backward_bytes(*shape, batch, seq))}
        for phase, (phase_flops, phase_bytes) in phases.items():
            spans = measured[:, :, PHASE[phase], 1] - measured[:, :, PHASE[phase], 0]
            seconds = float(np.median(np.nanmax(spans, axis=1)))
            points.append((run.devices[0] if run.devices else "unknown", f"training {phase}",
                           f"{c.get('model')} b{batch} s{seq} N={run.world_size}", phase_flops / phase_bytes,
                           phase_flops / seconds / 1e12))
    return points, notes


def build_rooflines(benches, runs_dir=None):
    """One Roofline per device seen in the usable bench files."""
    rooflines = {}
    for bench in benches:
        if bench.usable:
            _add_bench_points(rooflines.setdefault(bench.device, Roofline(bench.device)), bench)
    if runs_dir is not None:
        points, notes = training_phase_points(runs_dir)
        for device, group, label, intensity, tflops in points:
            if device in rooflines:
                rooflines[device].points.append((group, label, intensity, tflops))
            else:
                notes.append(f"training {label} ran on {device!r}, which no bench file measured; left out")
        for roofline in rooflines.values():
            roofline.notes += notes
    for roofline in rooflines.values():
        if not math.isfinite(roofline.peak_tflops):
            roofline.notes.append("no gemm file for this device: no compute roof, no plot")
        if not math.isfinite(roofline.bandwidth_gbs):
            roofline.notes.append("no bandwidth file for this device: no bandwidth roof, no plot")
    return list(rooflines.values())


def plot_roofline(roofline, path):
    """Writes the roofline PNG at `path`: TFLOP/s against FLOP/byte on log axes, the roofs,
    the fp32 GEMM roof dashed when lower, and the points by group. Needs finite roofs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    intensities = [p[2] for p in roofline.points if p[2] > 0 and p[3] > 0]
    ridge = roofline.peak_tflops * 1e3 / roofline.bandwidth_gbs
    low = min(intensities + [ridge]) / 4
    high = max(intensities + [ridge]) * 4
    x = np.geomspace(low, high, 256)
    figure, axis = plt.subplots(figsize=(10, 5.5))
    axis.plot(x, roofline.roof(x), color="black", linewidth=2,
              label=f"roofs: {roofline.peak_tflops:.3g} TFLOP/s ({roofline.peak_label}), "
                    f"{roofline.bandwidth_gbs:.4g} GB/s")
    if math.isfinite(roofline.fp32_tflops) and roofline.fp32_tflops < roofline.peak_tflops:
        axis.plot(x, np.minimum(roofline.fp32_tflops, roofline.bandwidth_gbs * x / 1e3), color="black",
                  linestyle="--", linewidth=1, label=f"fp32 GEMM roof {roofline.fp32_tflops:.3g} TFLOP/s")
    groups = sorted({p[0] for p in roofline.points})
    markers = "os^vD<>pPX*h"
    for index, group in enumerate(groups):
        mine = [p for p in roofline.points if p[0] == group and p[2] > 0 and p[3] > 0]
        axis.scatter([p[2] for p in mine], [p[3] for p in mine], marker=markers[index % len(markers)],
                     label=group, alpha=0.8, zorder=3)
        if group.startswith("layer parts") or group.startswith("training"):
            for _, label, intensity, tflops in mine:
                axis.annotate(label.split(" ")[0] if group.startswith("layer") else label, (intensity, tflops),
                              fontsize=6, xytext=(3, 3), textcoords="offset points")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("arithmetic intensity (FLOP/byte, op-level byte model)")
    axis.set_ylabel("TFLOP/s")
    axis.set_title(f"Roofline: {roofline.device}")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---- report ------------------------------------------------------------------------------------

def _figure_file(stem, number, count):
    return f"{stem}.png" if count == 1 else f"{stem}-{number}.png"


def write_bench_report(paths, out_dir, runs_dir=None, pytorch=None):
    """Reads the files, writes bench-report.md, bench-<name>.csv and the PNGs; returns
    (report text, benches). pytorch: the PytorchRuns drawn beside the inference files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    benches = [read_bench_file(path) for path in paths]
    rooflines = build_rooflines(benches, runs_dir)
    by_device = {roofline.device: roofline for roofline in rooflines}
    lines = ["# scalestudy benchmarks", "", "## Files", "",
             "| file | bench | status | device | backend | link | git |", "|---|---|---|---|---|---|---|"]
    for b in benches:
        lines.append(f"| `{b.path}` | {b.name or '—'} | {b.attrs.get('status', 'unreadable')} | {b.device} | "
                     f"{b.attrs.get('backend', '—')} | {machine.link_kind(b) or '—'} | {b.attrs.get('git_sha', '—')} |")
    for name in BENCH_NAMES:
        mine = [b for b in benches if b.usable and b.name == name]
        if not mine:
            continue
        pd.concat([b.points.assign(file=b.path, device=b.device) for b in mine]).to_csv(
            out_dir / f"bench-{name}.csv", index=False)
        lines += ["", f"## {name}", ""]
        for number, b in enumerate(mine):
            lines.append(f"`{b.path}` on {b.device}: " + "; ".join(
                f"{key} = {b.method[key]}" for key in ("timing", "flop_model", "byte_model", "definitions")
                if key in b.method))
            for title, table in bench_tables(b):
                index = table.index.name or {"gemm": "n", "bandwidth": "elements", "comm": "bytes"}.get(name, "")
                lines += ["", f"**{title}**", "", markdown(table, index)]
            if name == "comm" and comm_absent_lines(b):
                lines += ["", "Not measured:", ""] + comm_absent_lines(b)
            if name == "inference":
                lines += inference_section(b, pytorch, out_dir, _figure_file("inference-grid", number, len(mine)))
            if name == "layer":
                lines += layer_section(b, by_device.get(b.device), out_dir,
                                       _figure_file("layer-roofline", number, len(mine)))
            lines.append("")
    lines += ["", "## Roofline", ""]
    for number, roofline in enumerate(rooflines):
        plotted = math.isfinite(roofline.peak_tflops) and math.isfinite(roofline.bandwidth_gbs)
        if plotted:
            name = "roofline.png" if len(rooflines) == 1 else f"roofline-{number}.png"
            plot_roofline(roofline, out_dir / name)
            ridge = roofline.peak_tflops * 1e3 / roofline.bandwidth_gbs
            lines += [f"**{roofline.device}**: compute roof {roofline.peak_tflops:.4g} TFLOP/s "
                      f"({roofline.peak_label}), bandwidth roof {roofline.bandwidth_gbs:.4g} GB/s "
                      f"({roofline.bandwidth_label}), ridge at {ridge:.3g} FLOP/byte; "
                      f"{len(roofline.points)} points.", "", f"![roofline]({name})", ""]
        lines += [f"- {note}" for note in dict.fromkeys(roofline.notes)]
    if not rooflines:
        lines.append("No usable benchmark file: no roofline.")
    lines += ["", "Intensity = FLOPs / bytes moved, bytes by the op-level model (each tensor an op reads "
              "or writes counted once, accumulations read and written, fp32); see src/bench/bench_model.h."]
    problems = [p for b in benches for p in b.problems]
    lines += ["", "## Problems", ""] + ([f"- {p.line()}" for p in problems] or ["None."])
    text = "\n".join(lines) + "\n"
    (out_dir / "bench-report.md").write_text(text)
    return text, benches


def parser():
    """The argparse parser of scalestudy-bench-report."""
    result = argparse.ArgumentParser(
        prog="scalestudy-bench-report",
        description="Read `scalestudy bench` files and write OUT_DIR/bench-report.md (tables per "
                    "benchmark, roofline, problems), OUT_DIR/bench-<name>.csv and roofline PNGs.",
        epilog="Exit status: 0 on success, 2 on bad arguments or when no file is a usable "
               "benchmark file.")
    result.add_argument("files", metavar="BENCH_FILES", nargs="+", type=Path, help="benchmark HDF5 files")
    result.add_argument("-o", "--out", dest="out_dir", metavar="OUT_DIR", type=Path, required=True,
                        help="directory for the report, CSVs and PNGs (created if missing)")
    result.add_argument("--runs", metavar="RESULTS_DIR", type=Path, default=None,
                        help="training result files whose forward and backward phases join the roofline")
    result.add_argument("--pytorch", metavar="FILE.json", type=Path, default=None,
                        help="PyTorch's points (peers/inference_vs_pytorch.py --json), drawn beside the "
                             "inference files of the same model and GPU")
    return result


def main(argv=None):
    """Runs scalestudy-bench-report on argv (default sys.argv[1:]) and returns the exit
    status: 0, or 2 on bad arguments or when no file is a usable benchmark file."""
    args = parser().parse_args(argv)
    for path in args.files:
        if not path.is_file():
            print(f"scalestudy-bench-report: error: {str(path)!r} is not a file", file=sys.stderr)
            return USAGE_ERROR
    if args.runs is not None and not args.runs.is_dir():
        print(f"scalestudy-bench-report: error: --runs {str(args.runs)!r} is not a directory", file=sys.stderr)
        return USAGE_ERROR
    if args.out_dir.exists() and not args.out_dir.is_dir():
        print(f"scalestudy-bench-report: error: OUT_DIR {str(args.out_dir)!r} is not a directory", file=sys.stderr)
        return USAGE_ERROR
    pytorch = None
    if args.pytorch is not None:
        try:
            pytorch = read_pytorch(args.pytorch)
        except ValueError as error:
            print(f"scalestudy-bench-report: error: {error}", file=sys.stderr)
            return USAGE_ERROR
    _, benches = write_bench_report(args.files, args.out_dir, args.runs, pytorch)
    # The path, as scalestudy-report prints it; the tables are in the file.
    print(args.out_dir / "bench-report.md")
    problems = sum(len(b.problems) for b in benches)
    if problems:
        print(f"scalestudy-bench-report: {problems} problem(s), listed under Problems in the report",
              file=sys.stderr)
    return 0 if any(b.usable for b in benches) else USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
