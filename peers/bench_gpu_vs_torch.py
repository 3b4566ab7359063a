#!/usr/bin/env python3
"""scalestudy's micro-benchmarks against PyTorch on the same GPUs, in one run, timed the
same way (CUDA events around back-to-back calls, warm-up samples discarded, the median of
the timed samples, each sample at least --min-sample-ms long):

  (a) bf16 GEMM at n = 8192: `scalestudy bench gemm` (cublasGemmEx, fp32 accumulation)
      against torch.matmul on bf16 tensors; TFLOP/s = 2·n³ / median time.
  (b) allreduce at 1 GiB over 2 GPUs: `scalestudy bench comm` (NCCL) under mpirun against
      torch.distributed.all_reduce (NCCL) under torchrun; busbw = bytes / time ·
      2(n−1)/n (nccl-tests' definition), each sample the slowest rank's.

Run it with a Python that has PyTorch, on the GPU node, from the repository root:

    python3 peers/bench_gpu_vs_torch.py --binary build/cuda/scalestudy

NCCL runs with its defaults on both sides, but for the NCCL_* settings of the caller's
environment, which reach every rank. It prints the commit of the binary, the GPU,
both measurements and their ratios (scalestudy / PyTorch), and writes the raw numbers to
--workdir/bench_gpu_vs_torch.json.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

GEMM_N = 8192
COMM_BYTES = 1 << 30


def calls_for(seconds_per_call, min_sample_s):
    """The same rule as src/bench/bench_common.cpp: enough calls to last min_sample_s."""
    if seconds_per_call <= 0:
        return 10000
    return int(min(max(math.ceil(min_sample_s / seconds_per_call), 1), 10000))


def time_calls(torch, call, warmup, repeats, min_sample_s, before_sample=None, agree=None):
    """Per-call seconds of each timed sample, with CUDA events on the current stream.
    before_sample runs outside the timed span; agree makes the ranks use one call count."""
    def sample(calls):
        if before_sample:
            before_sample()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3 / calls

    calls = 1
    for _ in range(warmup):
        calls = calls_for(sample(calls), min_sample_s)
        calls = agree(calls) if agree else calls
    return [sample(calls) for _ in range(repeats)]


def random_nonzero(torch, n, dtype, seed):
    """Uniform in ±[0.25, 1), like scalestudy's inputs: never zero."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    magnitude = 0.25 + 0.75 * torch.rand(n, n, device="cuda", generator=generator)
    sign = torch.where(torch.rand(n, n, device="cuda", generator=generator) < 0.5, -1.0, 1.0)
    return (magnitude * sign).to(dtype)


def torch_gemm_worker(args):
    """The PyTorch GEMM, in a process of its own like scalestudy's."""
    import torch
    a = random_nonzero(torch, GEMM_N, torch.bfloat16, 11)
    b = random_nonzero(torch, GEMM_N, torch.bfloat16, 12)
    c = torch.empty_like(a)
    samples = time_calls(torch, lambda: torch.matmul(a, b, out=c), args.warmup, args.repeats,
                         args.min_sample_ms / 1e3)
    median = statistics.median(samples)
    print("RESULT " + json.dumps({"median_s": median, "tflops": 2 * GEMM_N ** 3 / median / 1e12,
                                  "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))


def torch_comm_worker(args):
    """One rank of the PyTorch allreduce (launched by torchrun)."""
    import torch
    import torch.distributed as dist
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world, rank = dist.get_world_size(), dist.get_rank()
    buffer = torch.zeros(COMM_BYTES // 4, dtype=torch.float32, device="cuda")

    def before_sample():
        torch.cuda.synchronize()
        dist.barrier()

    def agree(calls):
        value = torch.tensor([calls], device="cuda")
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    # The same exactness check as scalestudy's, once, before timing on zeros.
    check = torch.full((1024,), float(rank + 1), device="cuda")
    dist.all_reduce(check)
    wrong = int((check != world * (world + 1) / 2).sum().item())
    samples = time_calls(torch, lambda: dist.all_reduce(buffer), args.warmup, args.repeats,
                         args.min_sample_ms / 1e3, before_sample, agree)
    slowest = torch.tensor(samples, device="cuda", dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        median = statistics.median(slowest.tolist())
        algbw = COMM_BYTES / median / 1e9
        print("RESULT " + json.dumps({"median_s": median, "algbw_gb_per_s": algbw,
                                      "busbw_gb_per_s": algbw * 2 * (world - 1) / world, "wrong": wrong,
                                      "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
    dist.destroy_process_group()


def run(command, env):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        print(out.stdout[-3000:] + out.stderr[-3000:])
        return None
    return out.stdout


def common_options(args):
    return ["--backend", "cuda", "--warmup", str(args.warmup), "--repeats", str(args.repeats),
            "--min-sample-ms", str(args.min_sample_ms)]


def scalestudy_gemm(args, env):
    output = Path(args.workdir) / "gemm-bf16-8192.h5"
    out = run([args.binary, "bench", "gemm", "--sizes", str(GEMM_N), "--precisions", "bf16",
               *common_options(args), "-o", str(output)], env)
    match = re.search(r"gemm bf16 n=8192: median ([0-9.e+-]+) ms .*?, ([0-9.e+-]+) TFLOP/s", out or "")
    return {"median_s": float(match.group(1)) / 1e3, "tflops": float(match.group(2)), "file": str(output)} if match else None


def scalestudy_comm(args, env):
    output = Path(args.workdir) / "comm-allreduce-1g.h5"
    nccl = [option for name in sorted(env) if name.startswith("NCCL_") for option in ("-x", name)]
    out = run(["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", "2", "-x", "LD_LIBRARY_PATH",
               *nccl, args.binary, "bench", "comm", "--collectives", "allreduce",
               "--scopes", "world", "--min-bytes", "1G", "--max-bytes", "1G", *common_options(args), "-o", str(output)], env)
    match = re.search(r"comm world allreduce (\d+) bytes: median ([0-9.e+-]+) us .*?algbw ([0-9.e+-]+) GB/s, "
                      r"busbw ([0-9.e+-]+) GB/s, (\d+) wrong", out or "")
    if not match:
        return None
    return {"bytes": int(match.group(1)), "median_s": float(match.group(2)) / 1e6,
            "algbw_gb_per_s": float(match.group(3)), "busbw_gb_per_s": float(match.group(4)),
            "wrong": int(match.group(5)), "file": str(output)}


def torch_run(args, env, worker):
    """A PyTorch worker in processes of its own (torchrun on 2 GPUs for comm)."""
    script = [__file__, "--worker", worker, "--warmup", str(args.warmup), "--repeats", str(args.repeats),
              "--min-sample-ms", str(args.min_sample_ms)]
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] if worker == "comm" else []
    out = run([sys.executable, *launcher, *script], env)
    match = re.search(r"RESULT (\{.*\})", out or "")
    return json.loads(match.group(1)) if match else None


def ratio(ours, theirs, key):
    return ours[key] / theirs[key] if ours and theirs else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=("gemm", "comm"), help=argparse.SUPPRESS)
    parser.add_argument("--binary", default="build/cuda/scalestudy")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--min-sample-ms", type=float, default=1.0)
    parser.add_argument("--workdir", default="/tmp/scalestudy-bench-vs-torch")
    args = parser.parse_args()
    if args.worker == "gemm":
        return torch_gemm_worker(args)
    if args.worker == "comm":
        return torch_comm_worker(args)

    # This process never touches the GPU: every measurement runs in processes of its own.
    env = dict(os.environ)
    # A bundled binary's libraries travel next to it (dev/make_bundle.sh makes one).
    bundle = Path(args.binary).resolve().parent
    if any(bundle.glob("libhdf5_serial.so*")):
        env["LD_LIBRARY_PATH"] = f"{bundle}:{env.get('LD_LIBRARY_PATH', '')}"
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    commit = subprocess.run([args.binary, "--version"], capture_output=True, text=True, env=env).stdout.strip()
    names = []
    if shutil.which("nvidia-smi"):
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True).stdout.strip().splitlines()
    gpus = len(names)
    print(f"# {commit}; {gpus} x {names[0] if names else 'no GPU'}; python {sys.executable}; warm-up "
          f"{args.warmup}, {args.repeats} samples of >= {args.min_sample_ms} ms", flush=True)

    results = {"commit": commit, "gpu": names[0] if names else "", "gpus": gpus}
    results["gemm_scalestudy"] = scalestudy_gemm(args, env)
    results["gemm_torch"] = torch_run(args, env, "gemm")
    if results["gemm_torch"]:
        print(f"# torch {results['gemm_torch']['torch']} on {results['gemm_torch']['gpu']}")
    if gpus >= 2:
        results["comm_scalestudy"] = scalestudy_comm(args, env)
        results["comm_torch"] = torch_run(args, env, "comm")
    else:
        print("# (b) skipped: fewer than 2 GPUs visible")

    print("\n| measurement | scalestudy | PyTorch | ratio |\n|---|---|---|---|")
    ours, theirs = results["gemm_scalestudy"], results["gemm_torch"]
    print(f"| bf16 GEMM n={GEMM_N}, TFLOP/s | {ours['tflops'] if ours else float('nan'):.1f} | "
          f"{theirs['tflops'] if theirs else float('nan'):.1f} | {ratio(ours, theirs, 'tflops'):.3f} |")
    if gpus >= 2:
        ours, theirs = results["comm_scalestudy"], results["comm_torch"]
        print(f"| allreduce 1 GiB on 2 GPUs, busbw GB/s | {ours['busbw_gb_per_s'] if ours else float('nan'):.1f} | "
              f"{theirs['busbw_gb_per_s'] if theirs else float('nan'):.1f} | "
              f"{ratio(ours, theirs, 'busbw_gb_per_s'):.3f} |")
        print(f"wrong elements: scalestudy {ours['wrong'] if ours else '?'}, "
              f"PyTorch {theirs['wrong'] if theirs else '?'}")
    (Path(args.workdir) / "bench_gpu_vs_torch.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
