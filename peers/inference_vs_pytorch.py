#!/usr/bin/env python3
"""Measures scalestudy's inference forward against a PyTorch encoder of the same model over
a grid of batch × sequence length, side by side in one run on one GPU: latency, sequences/s
(QPS) and their ratios.

    python3 peers/inference_vs_pytorch.py --binary build/cuda/scalestudy --json grid.json

For each model, `scalestudy bench inference --backend cuda --precision bf16` runs the whole
grid once (its file goes to --workdir). Then PyTorch runs the same shape, read from that
file, in fp16 (peers/inference_torch.py says what it computes, what is compiled and
how often), in eager mode and under torch.compile, at every point, under
torch.inference_mode(). Times are medians of CUDA-event samples after warm-up on both
sides. A PyTorch point that runs out of memory is recorded as oom.

It prints one table per model: latency and QPS of each, and the speedups, PyTorch's
latency divided by scalestudy's (above 1: scalestudy is faster). It marks each point that
misses the bar: slower than torch.compile from batch 8 up, slower than eager anywhere, or
not run by scalestudy where PyTorch ran. --json writes the PyTorch points and the joined
table (`scalestudy-bench-report --pytorch` draws them). With --pytorch-file (an earlier
--json) and --scalestudy-file, it joins results without running them; only the PyTorch
runs need torch, and reading the bench files needs h5py.

PyTorch compiles the whole forward once per shape by default, as a user who writes
torch.compile(model) gets; that takes seconds per shape, so the default grid (5 lengths × 9
batches, BERT-base and BERT-large) takes tens of minutes, and --compile-scope regional
(one compiled block for all) shortens it at the cost of host time at small shapes. --quick
runs 6 points per model.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import h5py

# The command-line helpers are the sweep tool's (jobscripts/script_cli.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobscripts"))
from script_cli import USAGE_ERROR, UsageError, gpu_name, positive_int  # noqa: E402

DEFAULT_MODELS = ("bert-base", "bert-large")
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_SEQS = (64, 128, 384, 1024, 4096)
QUICK_BATCHES, QUICK_SEQS = (1, 8, 64), (128, 1024)
MODES = ("eager", "compile")
SHAPE_KEYS = ("layers", "hidden", "heads", "vocab", "max_seq", "attention")
# The bar the grid is judged by: at least as fast as torch.compile from this batch up
# (below it both are bound by kernel launches), and never slower than eager.
COMPILE_BAR_FROM_BATCH = 8
JSON_KIND = "scalestudy inference vs pytorch"
JSON_VERSION = 1


# ---- the scalestudy side ------------------------------------------------------------------

def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def read_scalestudy_file(path):
    """The points of a `bench inference` file by (batch, seq), its shape and provenance.
    A failed file keeps the points it measured; a file with no table has none."""
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise UsageError(f"{path}: not an HDF5 file ({error})") from None
    with handle:
        attrs = {key: _text(value) for key, value in handle.attrs.items()}
        if attrs.get("bench") != "inference":
            raise UsageError(f"{path} is not a `scalestudy bench inference` file")
        group = handle.get("bench/inference")
        method = {key: _text(value) for key, value in group.attrs.items()} if group is not None else {}
        columns = {}
        for key in ("batch", "seq", "status", "detail", "latency_ms", "sequences_per_s", "memory_bytes",
                    "allocated_bytes"):
            if group is not None and key in group:
                dataset = group[key]
                columns[key] = list(dataset.asstr()[()]) if dataset.dtype.kind in "OS" else dataset[()].tolist()
        device = handle["ranks/device"].asstr()[0] if "ranks/device" in handle else "unknown"
    points = {}
    for row in range(len(columns.get("batch", []))):
        point = {key: values[row] for key, values in columns.items()}
        points[(int(point["batch"]), int(point["seq"]))] = point
    shape = {key: (method[key] if key == "attention" else int(method[key])) for key in SHAPE_KEYS if key in method}
    return {"file": str(path), "status": attrs.get("status", ""), "failure_reason": attrs.get("failure_reason", ""),
            "git_sha": attrs.get("git_sha", ""), "precision": attrs.get("precision", ""), "device": device,
            "model": method.get("model", ""), "shape": shape, "points": points}


def run_scalestudy(args, model):
    """Runs the grid of one model; returns the file's path (None when it wrote none)."""
    output = Path(args.workdir) / f"inference-{model}.h5"
    output.unlink(missing_ok=True)
    command = [args.binary, "bench", "inference", "--backend", args.backend, "--precision", args.precision,
               "--model", model, "--batches", ",".join(map(str, args.batches)),
               "--seqs", ",".join(map(str, args.seqs)), *args.scalestudy_options.split(), "-o", str(output)]
    print("$ " + " ".join(command), flush=True)
    try:
        completed = subprocess.run(command, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        print(f"scalestudy ran past --timeout-s {args.timeout_s} for {model}", flush=True)
        return None
    if completed.returncode != 0:
        print(f"scalestudy exited with {completed.returncode} for {model}", flush=True)
    return output if output.is_file() else None


# ---- the join -----------------------------------------------------------------------------

def _ok_latency(point):
    if point is None or point.get("status") != "ok":
        return None
    return float(point["latency_ms"])


def _status(point):
    return "missing" if point is None else point.get("status", "missing")


def marks(row):
    """Why a joined row misses the bar (an empty list when it does not)."""
    found = []
    vs_compile, vs_eager = row.get("speedup_vs_compile"), row.get("speedup_vs_eager")
    if vs_compile is not None and vs_compile < 1.0 and row["batch"] >= COMPILE_BAR_FROM_BATCH:
        found.append("slower than compile")
    if vs_eager is not None and vs_eager < 1.0:
        found.append("slower than eager")
    if row["scalestudy_status"] != "ok" and any(row[f"{mode}_status"] == "ok" for mode in MODES):
        found.append(f"scalestudy {row['scalestudy_status']} where PyTorch ran")
    return found


def join(scalestudy_points, pytorch_points, batches, seqs):
    """One row per (batch, seq) of the grid: each side's status, latency (ms) and QPS, and
    the speedups PyTorch ms / scalestudy ms where both ran."""
    by_mode = {(p["mode"], int(p["batch"]), int(p["seq"])): p for p in pytorch_points}
    rows = []
    for seq in seqs:
        for batch in batches:
            row = {"batch": batch, "seq": seq}
            sides = {"scalestudy": scalestudy_points.get((batch, seq))}
            sides.update({mode: by_mode.get((mode, batch, seq)) for mode in MODES})
            for side, point in sides.items():
                latency = _ok_latency(point)
                row[f"{side}_status"] = _status(point)
                row[f"{side}_ms"] = latency
                row[f"{side}_qps"] = batch / latency * 1e3 if latency else None
            ours = row["scalestudy_ms"]
            for mode in MODES:
                theirs = row[f"{mode}_ms"]
                row[f"speedup_vs_{mode}"] = theirs / ours if ours and theirs else None
            row["marks"] = marks(row)
            rows.append(row)
    return rows


def _cell(row, side, key, form):
    value = row[f"{side}_{key}"]
    return form.format(value) if value is not None else row[f"{side}_status"]


def format_table(model, rows):
    """The joined rows as a markdown table, and a line that counts the marked points."""
    lines = [f"## {model}", "",
             "| batch | seq | scalestudy ms | eager ms | compile ms | scalestudy QPS | eager QPS | compile QPS "
             "| vs eager | vs compile | marks |", "|" + "---|" * 11]
    for row in rows:
        ratios = [f"{row[f'speedup_vs_{m}']:.3f}×" if row[f"speedup_vs_{m}"] is not None else "—" for m in MODES]
        cells = [str(row["batch"]), str(row["seq"])]
        cells += [_cell(row, side, "ms", "{:.4g}") for side in ("scalestudy",) + MODES]
        cells += [_cell(row, side, "qps", "{:,.0f}") for side in ("scalestudy",) + MODES]
        cells += ratios + ["; ".join(row["marks"]) or ""]
        lines.append("| " + " | ".join(cells) + " |")
    marked = [row for row in rows if row["marks"]]
    lines += ["", f"{model}: {len(marked)} of {len(rows)} points miss the bar (slower than compile at batch >= "
                  f"{COMPILE_BAR_FROM_BATCH}, slower than eager, or not run where PyTorch ran)."]
    return "\n".join(lines)


# ---- the JSON -----------------------------------------------------------------------------

def model_entry(scalestudy, pytorch_points, rows):
    info = {key: scalestudy[key] for key in ("file", "status", "failure_reason", "git_sha", "precision", "device")}
    return {"shape": scalestudy["shape"], "scalestudy": info, "pytorch": pytorch_points, "joined": rows}


def document(argv, machine, settings, models):
    return {"kind": JSON_KIND, "version": JSON_VERSION, "argv": argv, "machine": machine, "settings": settings,
            "bar": {"compile_from_batch": COMPILE_BAR_FROM_BATCH}, "models": models}


def read_document(path):
    try:
        with open(path) as handle:
            loaded = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"{path}: {error}") from None
    if not isinstance(loaded, dict) or loaded.get("kind") != JSON_KIND or loaded.get("version") != JSON_VERSION:
        raise UsageError(f"{path} is not a version-{JSON_VERSION} file of this script (kind {loaded.get('kind')!r})")
    return loaded


def write_document(path, doc):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        json.dump(doc, handle, indent=1, allow_nan=False)
        handle.write("\n")


# ---- the run ------------------------------------------------------------------------------

def machine_description(args, torch_versions):
    version = "unknown"
    if Path(args.binary).is_file():
        version = subprocess.run([args.binary, "--version"], capture_output=True, text=True).stdout.strip()
    gpu = torch_versions.get("gpu") or gpu_name()
    return dict(torch_versions, host=platform.node(), python=platform.python_version(), scalestudy=version,
                gpu=gpu or "unknown")


def scalestudy_results(args):
    """Per model: the read file, from --scalestudy-file or a run of the binary."""
    given = dict(args.scalestudy_file)
    results = {}
    for model in args.models:
        path = Path(given[model]) if model in given else run_scalestudy(args, model)
        results[model] = read_scalestudy_file(path) if path is not None else None
    return results


class PytorchSource:
    """PyTorch's points per model: read from --pytorch-file, or run here (importing torch)."""

    def __init__(self, args):
        self.args = args
        self.loaded = read_document(args.pytorch_file) if args.pytorch_file else None
        if self.loaded is not None:
            missing = [m for m in args.models if m not in self.loaded["models"]]
            if missing:
                raise UsageError(f"--pytorch-file {args.pytorch_file} has no {', '.join(missing)}")
            self.torch = None
        else:
            import inference_torch
            self.torch = inference_torch

    def versions(self):
        if self.torch is not None:
            return self.torch.versions()
        machine = self.loaded["machine"]
        return {key: machine.get(key, "unknown") for key in ("torch", "torch_cuda", "gpu")}

    def points(self, model, scalestudy):
        ours = scalestudy["shape"] if scalestudy else None
        if self.loaded is not None:
            theirs = self.loaded["models"][model]["shape"]
            if ours and theirs != ours:
                raise UsageError(f"--pytorch-file {self.args.pytorch_file}: {model} is {theirs} there, {ours} in "
                                 "the scalestudy file: not the same model")
            return self.loaded["models"][model]["pytorch"]
        if not ours:
            print(f"{model}: scalestudy wrote no model shape, so PyTorch has none to run", flush=True)
            return []
        a = self.args
        timing = self.torch.Timing(samples=a.samples, min_samples=min(3, a.samples), budget_s=a.point_budget_s,
                                   min_sample_s=a.min_sample_ms / 1e3)
        return self.torch.run_grid(ours, a.modes, a.batches, a.seqs, timing, a.compile_scope,
                                   lambda line: print(line, flush=True))


def model_pair(text):
    model, separator, path = text.partition("=")
    if not separator or not model or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not MODEL=FILE")
    return model, path


def parser():
    result = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    result.add_argument("--binary", default="build/cuda/scalestudy", help="the scalestudy executable")
    result.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="presets (scalestudy info)")
    result.add_argument("--batches", nargs="+", type=positive_int, default=None,
                        help="default: " + " ".join(map(str, DEFAULT_BATCHES)))
    result.add_argument("--seqs", nargs="+", type=positive_int, default=None,
                        help="default: " + " ".join(map(str, DEFAULT_SEQS)))
    result.add_argument("--quick", action="store_true",
                        help=f"batches {' '.join(map(str, QUICK_BATCHES))} × seqs {' '.join(map(str, QUICK_SEQS))} "
                             "where --batches and --seqs are not given")
    result.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"),
                        help="scalestudy's precision (PyTorch runs fp16)")
    result.add_argument("--backend", default="cuda", choices=("cuda", "cpu"),
                        help="scalestudy's backend (cpu with --pytorch-file checks the script without a GPU)")
    result.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="PyTorch modes to run")
    result.add_argument("--compile-scope", default="whole", choices=("regional", "whole"),
                        help="compile the whole forward, as torch.compile(model) does, or each block alone (one "
                             "compiled block for all: faster to compile, slower to enter at small shapes); "
                             "peers/inference_torch.py gives the trade-off (default: %(default)s)")
    result.add_argument("--samples", type=positive_int, default=5, help="PyTorch: timed samples per point")
    result.add_argument("--point-budget-s", type=float, default=1.0,
                        help="PyTorch: a point stops sampling after this many seconds once it has 3 samples")
    result.add_argument("--min-sample-ms", type=float, default=20.0,
                        help="PyTorch: a sample repeats the call until it lasts this long")
    # The first warm-up sample of the bench is a single call, which leaves a GPU that sat idle
    # at a low clock for the first point, several times slower than after other work. Two
    # more warm-up samples of min-sample-ms each bring it to its working clock.
    result.add_argument("--scalestudy-options", default="--warmup 3 --repeats 5 --min-sample-ms 20",
                        help="further options of scalestudy bench inference (its timing by default)")
    result.add_argument("--scalestudy-file", action="append", type=model_pair, default=[], metavar="MODEL=FILE",
                        help="use this bench inference file for MODEL instead of running scalestudy")
    result.add_argument("--pytorch-file", default=None, help="take PyTorch's points from this earlier --json")
    result.add_argument("--json", default=None, help="write the PyTorch points and the joined tables here")
    result.add_argument("--workdir", default="/tmp/scalestudy-inference", help="where scalestudy's files go")
    result.add_argument("--timeout-s", type=float, default=1800, help="limit of one scalestudy run")
    return result


NOT_WRITTEN = {"file": "", "status": "not written", "failure_reason": "", "git_sha": "", "precision": "",
               "device": "", "shape": {}, "points": {}}


def check_inputs(args):
    unknown = sorted(set(dict(args.scalestudy_file)) - set(args.models))
    if unknown:
        raise UsageError(f"--scalestudy-file names {', '.join(unknown)}, which --models does not")
    for _, path in args.scalestudy_file:
        if not Path(path).is_file():
            raise UsageError(f"--scalestudy-file {path}: no such file")
    if set(args.models) - set(dict(args.scalestudy_file)):
        if not Path(args.binary).is_file():
            raise UsageError(f"--binary {args.binary}: no such file")
        Path(args.workdir).mkdir(parents=True, exist_ok=True)


def main(argv=None):
    args = parser().parse_args(argv)
    args.batches = args.batches or list(QUICK_BATCHES if args.quick else DEFAULT_BATCHES)
    args.seqs = args.seqs or list(QUICK_SEQS if args.quick else DEFAULT_SEQS)
    command = [sys.argv[0]] + (sys.argv[1:] if argv is None else list(argv))
    settings = {"scalestudy_precision": args.precision, "scalestudy_backend": args.backend,
                "scalestudy_options": args.scalestudy_options, "pytorch_dtype": "fp16", "modes": args.modes,
                "compile_scope": args.compile_scope, "batches": args.batches, "seqs": args.seqs,
                "samples": args.samples, "point_budget_s": args.point_budget_s, "min_sample_ms": args.min_sample_ms}
    models, failed = {}, []
    try:
        check_inputs(args)
        pytorch = PytorchSource(args)
        # Every scalestudy run comes first, while this process holds no GPU memory.
        scalestudy = scalestudy_results(args)
        machine = machine_description(args, pytorch.versions())
        print(f"\n# inference, scalestudy {args.precision} against PyTorch fp16; {machine['scalestudy']}; "
              f"{machine['gpu']}; torch {machine['torch']} (CUDA {machine['torch_cuda']}); {machine['host']}\n")
        for model in args.models:
            ours = scalestudy[model] or NOT_WRITTEN
            if ours["status"] != "complete":
                failed.append(model)
                print(f"{model}: the scalestudy file is {ours['status']} {ours['failure_reason']}".rstrip())
            points = pytorch.points(model, scalestudy[model])
            rows = join(ours["points"], points, args.batches, args.seqs)
            print(format_table(model, rows) + "\n", flush=True)
            models[model] = model_entry(ours, points, rows)
            # Written after each model, so that an interrupted run keeps the models it finished.
            if args.json:
                write_document(args.json, document(command, machine, settings, models))
    except UsageError as error:
        print(f"inference_vs_pytorch.py: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    if args.json:
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
