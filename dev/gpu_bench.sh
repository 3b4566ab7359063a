#!/usr/bin/env bash
# The micro-benchmark suite on a GPU node of 2 GPUs or more (GEMM, bandwidth, layer,
# inference, and the collectives on 2 GPUs), and its comparison with PyTorch (bf16 GEMM
# against torch.matmul, 1 GiB allreduce busbw against torch.distributed). Writes the HDF5
# files and logs into OUTPUT_DIR; scalestudy-bench-report OUTPUT_DIR/*.h5 -o REPORT_DIR
# draws the tables and the roofline. PYTHON is a Python with PyTorch (default python3).
#   dev/gpu_bench.sh OUTPUT_DIR
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" "${1:-}"
log="$out/bench.log"
"$binary" --version | tee "$log"
nvidia-smi -L | tee -a "$log"

for bench in gemm bandwidth; do
  "$binary" bench $bench --backend cuda -o "$out/$bench.h5" 2>&1 | tee -a "$log" | tail -3
done
for bench in layer inference; do
  "$binary" bench $bench --backend cuda --repeats "${REPEATS:-5}" -o "$out/$bench.h5" 2>&1 | tee -a "$log" | tail -3
done
$mpirun -np 2 "$binary" bench comm --backend cuda -o "$out/comm.h5" 2>&1 | tee -a "$log" | tail -3

echo "== against PyTorch" | tee -a "$log"
"${PYTHON:-python3}" dev/bench_gpu_vs_torch.py --binary "$binary" --workdir "$out/vs-torch" 2>&1 |
  tee "$out/vs-torch.log" | tail -12
