#!/usr/bin/env python3
"""Measures scalestudy's training step against PyTorch's step of the same model, side by
side on one machine: tokens/s and TFLOP/s per GPU, scalestudy's ratio to each PyTorch mode,
and its own scaling factors from one GPU.

    python3 peers/bench_vs_pytorch.py --binary build/cuda/scalestudy --batch-per-gpu 64 \\
        --vocab 50304 50257 --gpus 1 2 --pytorch-modes compile --rounds 2 --json bench.json

scalestudy runs ddp+overlap (and zero2+overlap on more than one GPU) with its defaults,
and ddp+overlap once more with each --scalestudy-variants' options. A run's scaling factor
is over the run of the same name on one GPU; zero2's is over ddp's.
PyTorch (peers/train_torch.py) is GPT-2 written as nanoGPT writes it, in eager mode,
under torch.compile and under its max-autotune, with bf16 autocast, fused AdamW and
scaled_dot_product_attention (and in fp32 with --precision fp32, to compare like with
like); on several GPUs it runs DDP through torchrun. Both sides run each --vocab: by
default the preset's rounded up to a multiple of 64, the padding nanoGPT gives GPT-2.

Rounds: every run is repeated --rounds times, in plan order in the odd rounds and in the
reverse order in the even ones, so that over an even number of rounds each side runs as
often early as late: on GPUs at their power cap, a run's speed can depend on what ran
just before it. A row's tokens/s is the median over its rounds, and each ratio is the
median of the ratios taken within a round, with their range.

Exit status: 0 when every run gave its result, 1 when one did not (the table and the JSON
still hold the others), 2 for bad input. --backend cpu with no PyTorch modes runs
scalestudy's CPU build, to check the tool on a machine without a GPU. Run it with a Python
that has h5py, and PyTorch for the PyTorch rows; docs/benchmarks.md gives the published
figures and their commands.
"""
import argparse
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# The command-line helpers are the sweep tool's (jobscripts/script_cli.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobscripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from script_cli import (USAGE_ERROR, UsageError, binary_info, gpu_name, non_negative_int, positive_float,  # noqa: E402
                        positive_int)
from train_torch import PRESETS as TORCH_PRESETS, padded_vocab  # noqa: E402

BASELINE = "scalestudy ddp+overlap"
TORCH_WORKER = Path(__file__).resolve().parent / "train_torch.py"


@dataclass(frozen=True)
class Run:
    """One row of the table: a side's run at a GPU count, repeated once a round."""
    gpus: int
    name: str
    precision: str
    strategy: str = ""  # scalestudy's --strategy
    options: str = ""   # further scalestudy train options
    mode: str = ""      # PyTorch's eager, compile or max-autotune
    vocab: int = 0      # the vocabulary, the same on both sides

    @property
    def side(self):
        return "pytorch" if self.mode else "scalestudy"


def plan(args):
    """The runs of one round, in order: for each vocabulary and GPU count scalestudy's rows,
    then PyTorch's."""
    runs = []
    for vocab in args.vocab:
        for gpus in args.gpus:
            runs.append(Run(gpus, BASELINE, args.precision, "ddp", vocab=vocab))
            runs += [Run(gpus, f"{BASELINE} [{name}]", args.precision, "ddp", options, vocab=vocab)
                     for name, options in args.scalestudy_variants]
            if gpus > 1:
                runs.append(Run(gpus, "scalestudy zero2+overlap", args.precision, "zero2", vocab=vocab))
            if gpus in args.pytorch_gpus:
                runs += [Run(gpus, f"pytorch {mode}", precision, mode=mode, vocab=vocab)
                         for mode in args.pytorch_modes for precision in args.pytorch_precisions]
    return runs


def round_order(runs, round_index):
    """Round 0, 2, ... run in plan order; rounds 1, 3, ... in reverse."""
    return list(runs) if round_index % 2 == 0 else list(reversed(runs))


def launcher(gpus):
    command = ["mpirun", "-np", str(gpus)]
    # NCCL runs with its defaults, but for the NCCL_* settings of the caller's environment,
    # which reach every rank as they reach PyTorch's side.
    for name in sorted(os.environ):
        if name.startswith("NCCL_"):
            command += ["-x", name]
    if "LD_LIBRARY_PATH" in os.environ:
        command += ["-x", "LD_LIBRARY_PATH"]
    if os.geteuid() == 0:
        command.insert(1, "--allow-run-as-root")
    return command


def scalestudy_command(args, run, output):
    return launcher(run.gpus) + [
        args.binary, "train", "--backend", args.backend, "--precision", run.precision, "--model", args.model,
        "--vocab", str(run.vocab), "--seq", str(args.seq), "--batch-per-rank", str(args.batch_per_gpu), "--data", "random",
        "--steps", str(args.steps + args.warmup), "--warmup-steps", str(args.warmup),
        "--strategy", run.strategy, "--overlap", "on", "--log-every", "1000", "--output", str(output),
        "--overwrite", *shlex.split(run.options)]


def pytorch_command(args, run):
    worker = [str(TORCH_WORKER), "--model", args.model, "--vocab", str(run.vocab), "--seq", str(args.seq), "--batch-per-gpu",
              str(args.batch_per_gpu), "--mode", run.mode, "--precision", run.precision,
              "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if run.gpus > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={run.gpus}"] + worker
    return [sys.executable] + worker


def execute(command, timeout_s):
    """The command's standard output, or None and the reason it gave none."""
    print("$ " + shlex.join(command), flush=True)
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                             env=os.environ)
    except subprocess.TimeoutExpired:
        return None, f"ran past --timeout-s {timeout_s:g}"
    if out.returncode != 0:
        print((out.stdout[-3000:] + out.stderr[-3000:]).rstrip(), flush=True)
        return None, f"exited with {out.returncode}"
    return out.stdout, ""


def measure_scalestudy(args, run, round_index):
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", run.name).strip("-")
    output = Path(args.workdir) / f"{slug}-v{run.vocab}-{run.gpus}gpu-round{round_index + 1}.h5"
    _, reason = execute(scalestudy_command(args, run, output), args.timeout_s)
    if reason:
        return {"failed": reason}
    import h5py
    with h5py.File(output, "r") as handle:
        if "summary" not in handle:
            return {"failed": f"{output} has no /summary"}
        summary = handle["summary"].attrs
        return {"tokens_per_s": float(summary["tokens_per_s"]),
                "median_step_s": float(summary["step_time_median_s"]),
                "flops_per_step": float(summary["flops_per_step"]), "file": str(output)}


def measure_pytorch(args, run):
    stdout, reason = execute(pytorch_command(args, run), args.timeout_s)
    if reason:
        return {"failed": reason}
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"failed": "no RESULT line"}
    result = json.loads(lines[-1][len("RESULT "):])
    return {"tokens_per_s": float(result["tokens_per_s"]), "median_step_s": float(result["median_step_s"])}


def measure(args, run, round_index):
    if run.side == "pytorch":
        return measure_pytorch(args, run)
    return measure_scalestudy(args, run, round_index)


def ok(result):
    return result is not None and "failed" not in result


def median_or_nan(values):
    return statistics.median(values) if values else math.nan


def row(run, results, flops_per_step):
    """A run's figures over its rounds: the median of the rounds that gave a result."""
    done = [r for r in results if ok(r)]
    tokens = median_or_nan([r["tokens_per_s"] for r in done])
    step_s = median_or_nan([r["median_step_s"] for r in done])
    return {**asdict(run), "tokens_per_s": tokens, "median_step_s": step_s,
            "tflops_per_gpu": flops_per_step / step_s / run.gpus / 1e12,
            "rounds": [r if r is not None else {"failed": "not run"} for r in results]}


def paired(numerators, denominators):
    """The ratio within each round where both runs gave a result: median, lowest, highest."""
    ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(numerators, denominators) if ok(a) and ok(b)]
    if not ratios:
        return {"ratio": math.nan, "low": math.nan, "high": math.nan, "rounds": 0}
    return {"ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios), "rounds": len(ratios)}


def flops_at(runs, results, gpus, vocab):
    """Model FLOPs of one step at a GPU count and vocabulary, from any scalestudy result of
    them: the PyTorch rows train the same model on the same tokens."""
    for run in runs:
        if run.gpus == gpus and run.vocab == vocab and run.side == "scalestudy":
            for result in results[run]:
                if ok(result):
                    return result["flops_per_step"]
    return math.nan


def one_gpu_reference(run, runs):
    """The one-GPU run that a scalestudy run's scaling factor is taken over: the run of the same
    name on one GPU, so that a variant scales from its own options, or else the baseline's
    (zero2, which the bench does not run on one GPU). None without one."""
    on_one = {r.name: r for r in runs if r.gpus == 1 and r.vocab == run.vocab and r.side == "scalestudy"}
    return on_one.get(run.name, on_one.get(BASELINE))


def summarise(runs, results):
    """The rows, each scalestudy run's ratio to each PyTorch run on as many GPUs and the same
    vocabulary (the baseline's first), and each scalestudy run's factor over its one-GPU
    reference, paired round by round."""
    rows = [row(run, results[run], flops_at(runs, results, run.gpus, run.vocab)) for run in runs]
    ours = sorted((run for run in runs if run.side == "scalestudy"), key=lambda run: run.name != BASELINE)
    comparisons = [{"gpus": theirs.gpus, "vocab": theirs.vocab, "run": mine.name, "against": theirs.name,
                    "precision": theirs.precision, **paired(results[mine], results[theirs])}
                   for mine in ours for theirs in runs
                   if theirs.side == "pytorch" and (theirs.gpus, theirs.vocab) == (mine.gpus, mine.vocab)]
    references = {run: one_gpu_reference(run, runs) for run in runs if run.side == "scalestudy" and run.gpus > 1}
    factors = [{"gpus": run.gpus, "vocab": run.vocab, "run": run.name, "over": reference.name,
                **paired(results[run], results[reference])}
               for run, reference in references.items() if reference is not None]
    return rows, comparisons, factors


def cut(value):
    """Three decimals, cut rather than rounded: a ratio judged against a bar such as 1.25x or
    1.95x must not appear to reach it when it misses (1.2496 reads 1.249)."""
    if math.isnan(value):
        return "—"
    return f"{math.floor(value * 1000) / 1000:.3f}"


def tflops_text(value):
    """One decimal, or three significant digits for the small rates of the CPU backend."""
    return f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def ratio_text(entry, rounds):
    """The ratio, and over several rounds the range of the rounds' own ratios."""
    if entry["rounds"] == 0:
        return "no round gave both runs"
    if rounds < 2:
        return f"{cut(entry['ratio'])}x"
    return f"{cut(entry['ratio'])}x (median of {entry['rounds']} rounds; {cut(entry['low'])} to {cut(entry['high'])})"


def format_report(rows, comparisons, factors, rounds):
    lines = ["| GPUs | vocab | run | precision | tokens/s | TFLOP/s per GPU | vs scalestudy (same GPUs, vocab) | rounds |",
             "|---|---|---|---|---|---|---|---|"]
    for entry in rows:
        ours = next((r["tokens_per_s"] for r in rows if (r["gpus"], r["vocab"], r["name"]) ==
                     (entry["gpus"], entry["vocab"], BASELINE)), math.nan)
        done = sum(ok(r) for r in entry["rounds"])
        if done == 0:
            lines.append(f"| {entry['gpus']} | {entry['vocab']} | {entry['name']} | {entry['precision']} | failed | | | "
                         f"0 of {rounds} |")
            continue
        lines.append(f"| {entry['gpus']} | {entry['vocab']} | {entry['name']} | {entry['precision']} | "
                     f"{entry['tokens_per_s']:,.0f} | "
                     f"{tflops_text(entry['tflops_per_gpu'])} | {cut(entry['tokens_per_s'] / ours)} | "
                     f"{done} of {rounds} |")
    lines.append("")
    for entry in comparisons:
        lines.append(f"{entry['run']} over {entry['against']} ({entry['precision']}) on {entry['gpus']} GPU(s), "
                     f"vocab {entry['vocab']}: "
                     f"{ratio_text(entry, rounds)}")
    for entry in factors:
        lines.append(f"{entry['run']} on {entry['gpus']} GPUs over {entry['over']} on 1 GPU, vocab {entry['vocab']}: "
                     f"{ratio_text(entry, rounds)}")
    return "\n".join(lines)


def machine_description(args):
    version = subprocess.run([args.binary, "--version"], capture_output=True, text=True).stdout.strip()
    return {"scalestudy": version, "gpu": gpu_name() or "no GPU", "host": platform.node()}


def without_nan(value):
    """JSON has no NaN: a figure that no round gave is null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nan(item) for item in value]
    return value


def write_document(path, doc):
    """Written whole to a temporary file and renamed, so that a reader never sees half."""
    partial = Path(f"{path}.partial")
    partial.write_text(json.dumps(without_nan(doc), indent=1) + "\n")
    partial.replace(path)


def variant(text):
    """NAME=OPTIONS of --scalestudy-variants: a row name and further train options."""
    name, separator, options = text.partition("=")
    if not separator or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=OPTIONS, NAME of letters, digits, _ . -")
    return name, options


def parser():
    paragraphs = __doc__.split("\n\n")
    # The help ends with the docstring's paragraphs on rounds and the exit status.
    result = argparse.ArgumentParser(description=paragraphs[0], epilog="\n\n".join(paragraphs[3:5]))
    result.add_argument("--binary", default="build/cuda/scalestudy",
                        help="the scalestudy executable (default: %(default)s)")
    result.add_argument("--backend", choices=("cuda", "cpu"), default="cuda",
                        help="scalestudy's backend; cpu runs scalestudy only, to check the tool without a GPU "
                             "(default: %(default)s)")
    result.add_argument("--model", default="gpt2-small",
                        help="a preset of `scalestudy info`; PyTorch builds " + ", ".join(sorted(TORCH_PRESETS))
                             + " (default: %(default)s)")
    result.add_argument("--vocab", type=positive_int, nargs="+", default=None,
                        help="vocabulary sizes to run, each on both sides alike (default: the preset's, rounded "
                             "up to a multiple of 64 as nanoGPT pads GPT-2's 50257 to 50304)")
    result.add_argument("--seq", type=positive_int, default=1024, help="tokens per sequence (default: %(default)s)")
    result.add_argument("--batch-per-gpu", type=positive_int, default=8,
                        help="sequences per GPU per step, on both sides (default: %(default)s)")
    result.add_argument("--gpus", type=positive_int, nargs="+", default=[1],
                        help="GPU counts to run scalestudy at, ddp+overlap and, above 1, zero2+overlap (default: 1)")
    result.add_argument("--precision", choices=("fp32", "bf16"), default="bf16",
                        help="scalestudy's precision; PyTorch runs in this precision and in bf16 "
                             "(default: %(default)s)")
    result.add_argument("--steps", type=positive_int, default=10,
                        help="measured steps of each run, whose median is reported (default: %(default)s)")
    result.add_argument("--warmup", type=non_negative_int, default=3,
                        help="steps run first and left out of the median (default: %(default)s)")
    result.add_argument("--rounds", type=positive_int, default=1,
                        help="times every run is repeated, the order reversed in every other round; rows and "
                             "ratios are medians over the rounds (default: %(default)s)")
    result.add_argument("--workdir", default="/tmp/scalestudy-bench",
                        help="where scalestudy's result files go (default: %(default)s)")
    result.add_argument("--json", default=None,
                        help="write every round's figures, the rows and the ratios here, after each run")
    result.add_argument("--timeout-s", type=positive_float, default=900,
                        help="limit of one run in seconds (default: %(default)s)")
    result.add_argument("--pytorch-gpus", type=positive_int, nargs="*", default=None,
                        help="GPU counts, of --gpus, to run PyTorch at (default: every --gpus)")
    result.add_argument("--pytorch-modes", nargs="*", default=None, choices=("eager", "compile", "max-autotune"),
                        help="how PyTorch runs the model: eager, torch.compile, torch.compile(mode='max-autotune') "
                             "(GEMMs tuned per shape, CUDA graphs: the peer of a --gemm-algos-file variant), "
                             "any of them, or none when given with no value (default: eager and compile; none "
                             "with --backend cpu)")
    result.add_argument("--pytorch-precisions", nargs="+", default=None, choices=("fp32", "bf16"),
                        help="the precisions PyTorch runs in (default: scalestudy's precision and bf16)")
    result.add_argument("--scalestudy-variants", nargs="*", default=[], type=variant, metavar="NAME=OPTIONS",
                        help="more scalestudy rows, each with further train options under a name, e.g. "
                             "flash='--attention-kernel flash'; on several GPUs, each scales from its own "
                             "one-GPU row")
    return result


def check_inputs(args):
    """Fills the defaults that depend on other options; raises UsageError naming the option."""
    if not (Path(args.binary).is_file() and os.access(args.binary, os.X_OK)):
        raise UsageError(f"--binary {args.binary}: not an executable file")
    if args.pytorch_modes is None:
        args.pytorch_modes = [] if args.backend == "cpu" else ["eager", "compile"]
    if args.backend == "cpu" and args.pytorch_modes:
        raise UsageError("--pytorch-modes: PyTorch's side runs on GPUs only; with --backend cpu give none")
    presets = {preset["name"]: preset["vocab"] for preset in binary_info(args.binary)["presets"]}
    if args.model not in presets:
        raise UsageError(f"--model {args.model}: not a preset of `{args.binary} info`")
    args.vocab = args.vocab or [padded_vocab(presets[args.model])]
    if args.pytorch_modes and args.model not in TORCH_PRESETS:
        raise UsageError(f"--model {args.model}: PyTorch's side builds {', '.join(sorted(TORCH_PRESETS))} only; "
                         "give --pytorch-modes no value to run scalestudy alone")
    args.pytorch_gpus = args.gpus if args.pytorch_gpus is None else args.pytorch_gpus
    missing = sorted(set(args.pytorch_gpus) - set(args.gpus))
    if missing:
        raise UsageError(f"--pytorch-gpus {' '.join(map(str, missing))}: not among --gpus")
    args.pytorch_precisions = args.pytorch_precisions or sorted({args.precision, "bf16"})
    Path(args.workdir).mkdir(parents=True, exist_ok=True)


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        check_inputs(args)
    except UsageError as error:
        print(f"bench_vs_pytorch.py: error: {error}", file=sys.stderr)
        return USAGE_ERROR
    machine = machine_description(args)
    print(f"# {args.model} seq {args.seq}, batch {args.batch_per_gpu} per GPU, {args.rounds} round(s); "
          f"{machine['scalestudy']}; {machine['gpu']}; {machine['host']}", flush=True)
    runs = plan(args)
    results = {run: [None] * args.rounds for run in runs}
    command = [sys.argv[0]] + (sys.argv[1:] if argv is None else list(argv))
    for round_index in range(args.rounds):
        for run in round_order(runs, round_index):
            result = measure(args, run, round_index)
            results[run][round_index] = result
            figure = f"{result['tokens_per_s']:,.0f} tokens/s" if ok(result) else f"failed: {result['failed']}"
            print(f"[round {round_index + 1}/{args.rounds}] {run.gpus} GPU(s), vocab {run.vocab}, {run.name} "
                  f"{run.precision}: {figure}",
                  flush=True)
            if args.json:
                rows, comparisons, factors = summarise(runs, results)
                write_document(args.json, {"command": command, "machine": machine, "rows": rows,
                                           "comparisons": comparisons, "factors": factors})
    rows, comparisons, factors = summarise(runs, results)
    print("\n" + format_report(rows, comparisons, factors, args.rounds))
    if args.json:
        print(f"wrote {args.json}")
    return 0 if all(ok(r) for run in runs for r in results[run]) else 1


if __name__ == "__main__":
    sys.exit(main())
