#!/usr/bin/env bash
# One call on a GPU machine: the GPU tests, short training runs on 1 and 2 GPUs, and the
# benchmark against PyTorch. Expects the binaries and the two libraries the GPU image
# lacks in .gpu-bundle/ (see README, "Running on a GPU node"); writes logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-gpu-check
gpus=$(nvidia-smi -L | wc -l)
{ nvidia-smi; nvidia-smi topo -m; "$binary" --version; } >"$out/machine.txt" 2>&1
ldd "$binary" | grep "not found" && echo "missing libraries" | tee -a "$out/machine.txt"

if [ "${TESTS:-1}" = 1 ]; then
echo "== GPU tests" | tee "$out/gpu-tests.log"
for test in test_cuda_ops test_cuda_ops_bf16 test_cuda_ops_half_gpt2; do
  $mpirun -np 1 "$bundle/$test" 2>&1 | tee -a "$out/gpu-tests.log" | grep -E "PASSED|FAILED|SKIPPED|tests ran"
done
if [ "$gpus" -ge 2 ]; then
  $mpirun -np 2 "$bundle/mpi_test_nccl_strategies" 2>&1 | tee -a "$out/gpu-tests.log" | grep -E "PASSED|FAILED|SKIPPED|tests ran"
fi

fi

if [ "${TRAIN:-1}" = 1 ]; then
echo "== training runs" | tee "$out/train.log"
common="train --backend cuda --precision ${PRECISION:-bf16} --model gpt2-small --seq 1024 --batch-per-rank ${BATCH:-8} --steps 15 --warmup-steps 5 --log-every 5"
$mpirun -np 1 "$binary" $common --output "$out/gpt2s-n1.h5" 2>&1 | tee -a "$out/train.log" | tail -6
if [ "$gpus" -ge 2 ]; then
  for strategy in ddp zero2; do
    $mpirun -np 2 "$binary" $common --strategy $strategy --overlap on \
      --output "$out/gpt2s-n2-$strategy.h5" 2>&1 | tee -a "$out/train.log" | tail -6
  done
fi

fi

if [ "${BENCH:-1}" = 1 ]; then
  echo "== against PyTorch" | tee "$out/bench.log"
  python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --gpus 1 $([ "$gpus" -ge 2 ] && echo 2) \
    --batch-per-gpu "${BATCH:-8}" --precision "${PRECISION:-bf16}" --pytorch-gpus 1 \
    --pytorch-modes eager compile --pytorch-precisions ${TORCH_PRECISIONS:-bf16} \
    --workdir /tmp/bench 2>&1 | tee -a "$out/bench.log" | tail -14
fi
