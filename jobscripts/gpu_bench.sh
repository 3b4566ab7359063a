#!/usr/bin/env bash
# One call on a 2-GPU machine: the micro-benchmark suite on the GPUs and its comparison
# with PyTorch (bf16 GEMM against torch.matmul, 1 GiB allreduce busbw against
# torch.distributed). Expects .gpu-bundle/ as jobscripts/gpu_check.sh does; writes the
# HDF5 files and logs under $OUT (the bench report is drawn from them afterwards:
# scalestudy-bench-report FILES -o DIR).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-gpu-bench
"$binary" --version | tee "$out/bench.log"
nvidia-smi -L | tee -a "$out/bench.log"

for bench in gemm bandwidth; do
  "$binary" bench $bench --backend cuda -o "$out/$bench.h5" 2>&1 | tee -a "$out/bench.log" | tail -3
done
"$binary" bench layer --backend cuda --repeats ${REPEATS:-5} -o "$out/layer.h5" 2>&1 | tee -a "$out/bench.log" | tail -3
"$binary" bench inference --backend cuda --repeats ${REPEATS:-5} -o "$out/inference.h5" 2>&1 | tee -a "$out/bench.log" | tail -3
$mpirun -np 2 "$binary" bench comm --backend cuda -o "$out/comm.h5" 2>&1 | tee -a "$out/bench.log" | tail -3

echo "== against PyTorch" | tee -a "$out/bench.log"
python3 jobscripts/bench_gpu_vs_torch.py --binary "$binary" --workdir /tmp/vs-torch 2>&1 | tee "$out/vs-torch.log" | tail -12
