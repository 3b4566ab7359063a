#!/usr/bin/env python3
"""Measures scalestudy's training step against a PyTorch implementation of the same model,
side by side in one run on one machine: tokens/s and TFLOP/s per GPU, and their ratios.

    python3 jobscripts/bench_vs_pytorch.py --binary build/cuda/scalestudy --batch-per-gpu 32 --gpus 1 2

scalestudy runs ddp+overlap (and zero2+overlap on more than one GPU) with its defaults.
PyTorch runs in eager mode and under torch.compile, with bf16 autocast, fused AdamW and
scaled_dot_product_attention (and in fp32 with --precision fp32, to compare like with
like). Multi-GPU PyTorch runs use DDP through torchrun. Run it with a Python that has
PyTorch and h5py; docs/benchmarks.md gives the published figures and their commands.
"""
import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

PRESETS = {"gpt2-small": (12, 768, 12, 50257, 1024), "gpt2-medium": (24, 1024, 16, 50257, 1024),
           "bert-large": (24, 1024, 16, 30522, 512)}


def training_flops(layers, hidden, vocab, batch, seq):
    """The project's accounting (src/model/flops.h): 3 x forward."""
    forward = layers * (24 * batch * seq * hidden ** 2 + 4 * batch * seq ** 2 * hidden) + 2 * batch * seq * hidden * vocab
    return 3 * forward


def torch_worker(args):
    """One rank of the PyTorch run (launched directly or by torchrun)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    layers, hidden, heads, vocab, max_seq = PRESETS[args.model]
    causal = not args.model.startswith("bert")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        torch.distributed.init_process_group("nccl")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc, self.fc_proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(max_seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.lnf = nn.LayerNorm(hidden)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))

    model = Gpt().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    step_model = torch.compile(model) if args.mode == "compile" else model
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator(device="cuda").manual_seed(1234 + rank)
    batch = args.batch_per_gpu
    tokens = torch.randint(0, vocab, (batch, args.seq + 1), device="cuda", generator=generator)

    def step():
        with torch.autocast("cuda", dtype=dtype, enabled=args.precision == "bf16"):
            loss = step_model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    if world > 1:
        slowest = torch.tensor(times, device="cuda")
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        times = slowest.tolist()
        torch.distributed.destroy_process_group()
    if rank == 0:
        times.sort()
        median = times[len(times) // 2]
        print("RESULT " + json.dumps({"median_step_s": median, "tokens_per_s": batch * args.seq * world / median}))


def run(command, env=None, timeout=900):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        print(out.stdout[-3000:] + out.stderr[-3000:])
        return None
    return out.stdout


def bench_pytorch(args, gpus, mode, precision):
    script = [sys.executable, __file__, "--worker", "--model", args.model, "--seq", str(args.seq),
              "--batch-per-gpu", str(args.batch_per_gpu), "--mode", mode, "--precision", precision,
              "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if gpus > 1:
        script = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"] + script[1:]
    out = run(script, env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
    match = re.search(r"RESULT (\{.*\})", out or "")
    return json.loads(match.group(1)) if match else None


def bench_scalestudy(args, gpus, precision, strategy, overlap, variant=("", "")):
    name, options = variant
    output = Path(args.workdir) / f"scalestudy-{gpus}gpu-{strategy}-{overlap}{'-' + name if name else ''}.h5"
    command = ["mpirun", "--allow-run-as-root", "-np", str(gpus), "-x", "LD_LIBRARY_PATH", "-x", "NCCL_NVLS_ENABLE=0",
               args.binary, "train", "--backend", "cuda", "--precision", precision, "--model", args.model,
               "--seq", str(args.seq), "--batch-per-rank", str(args.batch_per_gpu), "--data", "random",
               "--steps", str(args.steps + args.warmup), "--warmup-steps", str(args.warmup),
               "--strategy", strategy, "--overlap", overlap, "--log-every", "1000", "--output", str(output),
               "--overwrite", *shlex.split(options)]
    out = run(command, env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
    if out is None:
        return None
    import h5py
    with h5py.File(output, "r") as handle:
        summary = handle["summary"].attrs
        return {"median_step_s": float(summary["step_time_median_s"]), "tokens_per_s": float(summary["tokens_per_s"])}


def variant(text):
    """NAME=OPTIONS of --scalestudy-variants: a row name and further train options."""
    name, sep, options = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=OPTIONS, NAME of letters, digits, _ . -")
    return name, options


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    parser.add_argument("--binary", default="build/cuda/scalestudy",
                        help="the scalestudy executable, a CUDA build (default: %(default)s)")
    parser.add_argument("--model", choices=sorted(PRESETS), default="gpt2-small",
                        help="the model both sides train (default: %(default)s)")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--batch-per-gpu", type=int, default=8,
                        help="sequences per GPU per step, on both sides (default: %(default)s)")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1],
                        help="GPU counts to run scalestudy at, ddp+overlap and, above 1, zero2+overlap "
                             "(default: 1)")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16",
                        help="scalestudy's precision; PyTorch runs in this precision and in bf16 (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=10,
                        help="measured steps of each run, whose median is reported (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="steps run first and left out of the median (default: %(default)s)")
    parser.add_argument("--workdir", default="/tmp/scalestudy-bench",
                        help="where scalestudy's result files go (default: %(default)s)")
    parser.add_argument("--pytorch-gpus", type=int, nargs="*", default=None,
                        help="GPU counts to run PyTorch at (default: every --gpus)")
    parser.add_argument("--pytorch-modes", nargs="+", default=["eager", "compile"], choices=("eager", "compile"),
                        help="how PyTorch runs the model: eager, torch.compile, or both (default: both)")
    parser.add_argument("--pytorch-precisions", nargs="+", default=None, choices=("fp32", "bf16"),
                        help="the precisions PyTorch runs in (default: scalestudy's precision and bf16)")
    parser.add_argument("--scalestudy-variants", nargs="*", default=[], type=variant, metavar="NAME=OPTIONS",
                        help="more scalestudy rows, each with further train options under a name, e.g. "
                             "flash='--attention-kernel flash'")
    args = parser.parse_args()
    if args.worker:
        return torch_worker(args)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    layers, hidden, _, vocab, _ = PRESETS[args.model]
    rows = []
    # The binary's own build records its commit (a copy of the tree may carry no .git).
    sha = subprocess.run([args.binary, "--version"], capture_output=True, text=True).stdout.strip()
    gpu = shutil.which("nvidia-smi") and subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"# {args.model} seq {args.seq}, batch {args.batch_per_gpu} per GPU; commit {sha}; {gpu}; {platform.node()}")
    for gpus in args.gpus:
        flops = training_flops(layers, hidden, vocab, args.batch_per_gpu * gpus, args.seq)
        runs = [("scalestudy ddp+overlap", bench_scalestudy(args, gpus, args.precision, "ddp", "on"), args.precision)]
        runs += [(f"scalestudy ddp+overlap [{v[0]}]", bench_scalestudy(args, gpus, args.precision, "ddp", "on", v),
                  args.precision) for v in args.scalestudy_variants]
        if gpus > 1:
            runs.append(("scalestudy zero2+overlap", bench_scalestudy(args, gpus, args.precision, "zero2", "on"),
                         args.precision))
        torch_gpus = args.gpus if args.pytorch_gpus is None else args.pytorch_gpus
        precisions = args.pytorch_precisions or sorted({args.precision, "bf16"})
        for mode in args.pytorch_modes if gpus in torch_gpus else []:
            for precision in precisions:
                runs.append((f"pytorch {mode}", bench_pytorch(args, gpus, mode, precision), precision))
        for name, result, precision in runs:
            if result:
                tflops = flops / result["median_step_s"] / gpus / 1e12
                rows.append((gpus, name, precision, result["tokens_per_s"], tflops))
            else:
                rows.append((gpus, name, precision, math.nan, math.nan))
    print("\n| GPUs | run | precision | tokens/s | TFLOP/s per GPU | vs scalestudy (same GPUs) |")
    print("|---|---|---|---|---|---|")
    for gpus, name, precision, tokens, tflops in rows:
        ours = next((r[3] for r in rows if r[0] == gpus and r[1] == "scalestudy ddp+overlap"), math.nan)
        print(f"| {gpus} | {name} | {precision} | {tokens:,.0f} | {tflops:.1f} | {tokens / ours:.2f} |")
    one_gpu = next((r[3] for r in rows if r[0] == 1 and r[1] == "scalestudy ddp+overlap"), math.nan)
    for gpus, name, _, tokens, _ in rows:
        if gpus > 1 and name.startswith("scalestudy"):
            # Three decimals: a factor judged against a bar such as 1.95x must not round up to it.
            print(f"{name} on {gpus} GPUs: {tokens / one_gpu:.3f}x scalestudy's own 1-GPU tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
