#!/usr/bin/env bash
# On a GPU node of 2 GPUs or more, from a bundle: every GPU test of the bundle, then the
# kernel profile (--profile-kernels) of GPT-2 small bf16 with ddp+overlap on each of
# PROFILE_GPUS (default "1 2") GPUs and of one traced GEMM benchmark, the untraced
# throughput at each of BATCHES (default "8 16") and, with --recompute on, of
# RECOMPUTE_BATCHES (default 32), then jobscripts/bench_vs_pytorch.py for each of MODELS
# (default gpt2-small) at TORCH_BATCH per GPU (default 16) on TORCH_GPUS (default "1 2").
# TESTS=0, PROFILE=0, THROUGHPUT=0 or VS_TORCH=0 skips a part. Writes the logs into
# OUTPUT_DIR and the result files into OUTPUT_DIR/profile/ (scalestudy-report reads them).
#   dev/gpu_profile.sh OUTPUT_DIR
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" "${1:-}"
{ "$binary" --version; nvidia-smi -L; } | tee "$out/machine.txt"

if [ "${TESTS:-1}" = 1 ]; then
  echo "== GPU tests" | tee "$out/gpu-tests.log"
  for test in "$bundle"/test_*; do
    [ -x "$test" ] || continue
    timeout 600 $mpirun -np 1 "$test" >>"$out/gpu-tests.log" 2>&1
    echo "$(basename "$test"): exit $?" | tee -a "$out/gpu-tests.log"
  done
  for test in "$bundle"/mpi_test_*; do
    [ -x "$test" ] || continue
    timeout 600 $mpirun -np 2 "$test" >>"$out/gpu-tests.log" 2>&1
    echo "$(basename "$test") (2 GPUs): exit $?" | tee -a "$out/gpu-tests.log"
  done
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/gpu-tests.log"
fi

if [ "${PROFILE:-1}" = 1 ]; then
  echo "== kernel profile" | tee "$out/profile.log"
  mkdir -p "$out/profile"
  common="train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank ${PROFILE_BATCH:-8} --steps 12
          --warmup-steps 3 --profile-kernels --profile-window 5-7 --experiment kernel-profile --log-every 4
          --strategy ddp --overlap on"
  for n in ${PROFILE_GPUS:-1 2}; do
    $mpirun -np "$n" "$binary" $common --output "$out/profile/profile-n$n.h5" 2>&1 | tee -a "$out/profile.log" | tail -8
  done
  "$binary" bench gemm --backend cuda --sizes 512,4096 --precisions bf16 --profile-kernels \
    -o "$out/profile/bench-gemm-traced.h5" 2>&1 | tee -a "$out/profile.log" | tail -4
fi

if [ "${THROUGHPUT:-1}" = 1 ]; then
  echo "== throughput (untraced)" | tee "$out/throughput.log"
  for batch in ${BATCHES:-8 16}; do
    $mpirun -np 1 "$binary" train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank "$batch" \
      --steps 20 --warmup-steps 5 --log-every 20 2>&1 | tee -a "$out/throughput.log" | grep -E "median step|MFU"
  done
  for batch in ${RECOMPUTE_BATCHES:-32}; do
    echo "-- --recompute on, batch $batch" | tee -a "$out/throughput.log"
    $mpirun -np 1 "$binary" train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank "$batch" \
      --recompute on --steps 20 --warmup-steps 5 --log-every 20 2>&1 | tee -a "$out/throughput.log" |
      grep -E "median step|recomputation|MFU|peak memory"
  done
fi

if [ "${VS_TORCH:-1}" = 1 ]; then
  echo "== against PyTorch" | tee "$out/vs-torch.log"
  for model in ${MODELS:-gpt2-small}; do
    seq=1024
    case "$model" in bert-*) seq=512 ;; esac  # BERT's position table ends at 512
    "${PYTHON:-python3}" jobscripts/bench_vs_pytorch.py --binary "$binary" --model "$model" --seq "$seq" \
      --gpus ${TORCH_GPUS:-1 2} --precision bf16 --batch-per-gpu "${TORCH_BATCH:-16}" --pytorch-gpus 1 \
      --pytorch-modes ${TORCH_MODES:-eager compile} --workdir "$out/vs-torch-$model" 2>&1 |
      tee -a "$out/vs-torch.log" | tail -14
  done
fi
