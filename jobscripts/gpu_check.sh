#!/usr/bin/env bash
# Checks a GPU node end to end, as a user runs scalestudy there: builds the CUDA
# configuration on the node, runs the GPU tests, then short GPT-2 small training runs on
# one GPU and, where the node has two or more, on two with each strategy. Logs and result
# files go into OUTPUT_DIR (default ./gpu-check); the last line says what failed, if
# anything, and the exit status is 0 only if nothing did.
#
#   bash jobscripts/gpu_check.sh [OUTPUT_DIR]
#
# It needs what `cmake --preset cuda` needs: the CUDA toolkit (nvcc under /usr/local/cuda),
# NCCL, MPI, HDF5 and Boost.Program_options (jobscripts/install-deps.sh names the Debian and
# Ubuntu packages of all but CUDA and NCCL). `scalestudy-report OUTPUT_DIR -o REPORT_DIR`
# draws the report of the training runs.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-gpu-check}
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$root" || exit 1

# NCCL runs with its defaults, except for the NCCL_* settings of the caller's environment
# (NCCL_NVLS_ENABLE=0, say), which reach every rank.
mpirun=(mpirun --bind-to none)
for name in $(compgen -e | grep '^NCCL_'); do mpirun+=(-x "$name"); done
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
failed=()

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
{ nvidia-smi; nvidia-smi topo -m; } >"$out/machine.txt" 2>&1
echo "== $gpus GPU(s); writing into $out"
if [ "$gpus" -lt 1 ]; then
  echo "gpu_check: no GPU visible (nvidia-smi -L)" >&2
  exit 1
fi

echo "== build: cmake --preset cuda && cmake --build --preset cuda"
if ! { cmake --preset cuda && cmake --build --preset cuda -j "$(nproc)"; } >"$out/build.log" 2>&1; then
  tail -20 "$out/build.log"
  echo "gpu_check: the build failed, see $out/build.log" >&2
  exit 1
fi
binary=build/cuda/scalestudy
"$binary" --version | tee -a "$out/machine.txt"

echo "== GPU tests: ctest --preset cuda -L gpu"
ctest --preset cuda -L gpu --timeout 900 >"$out/gpu-tests.log" 2>&1 || failed+=("GPU tests ($out/gpu-tests.log)")
grep -E "tests passed|Failed|\*\*\*|Skipped" "$out/gpu-tests.log"

echo "== training: GPT-2 small, bf16, batch 8 per GPU"
train=(train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank 8 --steps 15 --warmup-steps 5
       --log-every 5)
run() {  # run NAME RANKS [options]: one training run, its summary printed
  local name=$1 ranks=$2
  shift 2
  if "${mpirun[@]}" -np "$ranks" "$binary" "${train[@]}" "$@" --output "$out/$name.h5" >"$out/$name.log" 2>&1; then
    grep -E "median step|communication|GPU state" "$out/$name.log" | sed "s/^/[$name] /"
  else
    tail -5 "$out/$name.log"
    failed+=("$name ($out/$name.log)")
  fi
}
run gpt2-small-1gpu 1
if [ "$gpus" -ge 2 ]; then
  run gpt2-small-2gpu-ddp 2 --strategy ddp --overlap on
  run gpt2-small-2gpu-zero2 2 --strategy zero2 --overlap on
fi

if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu_check: every check passed ($out)"
else
  echo "gpu_check: failed: ${failed[*]}" >&2
  exit 1
fi
