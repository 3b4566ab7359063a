#!/usr/bin/env bash
# One call on a machine of 2 or more GPUs: every GPU test, then the kernel profile
# (--profile-kernels) of GPT-2 small in bf16 on 1, 2, ... GPUs (PROFILE_GPUS) and of one
# traced benchmark, and the untraced training throughput at the batches given (BATCHES,
# and RECOMPUTE_BATCHES with --recompute on), then the comparison with PyTorch for each of
# MODELS (default gpt2-small) at TORCH_BATCH per GPU on TORCH_GPUS. Expects
# .gpu-bundle/ as jobscripts/gpu_check.sh does; writes logs under $OUT and the HDF5 files
# into $OUT/profile-h5.tgz (draw the report from them afterwards: scalestudy-report DIR).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-gpu-profile
{ "$binary" --version; nvidia-smi -L; } | tee "$out/machine.txt"

if [ "${TESTS:-1}" = 1 ]; then
  echo "== GPU tests" | tee "$out/gpu-tests.log"
  for test in ${GPU_TESTS:-test_cuda_ops test_cuda_ops_bf16 test_cuda_ops_half_gpt2 test_flash_attention test_cupti_tracer test_nvml_telemetry}; do
    timeout 300 $mpirun -np 1 "$bundle/$test" >>"$out/gpu-tests.log" 2>&1
    echo "$test: exit $?" | tee -a "$out/gpu-tests.log"
  done
  for test in ${MULTI_GPU_TESTS:-mpi_test_nccl_strategies mpi_test_kernel_profile}; do
    timeout 300 $mpirun -np 2 "$bundle/$test" >>"$out/gpu-tests.log" 2>&1
    echo "$test (2 GPUs): exit $?" | tee -a "$out/gpu-tests.log"
  done
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |kernels/phases|speedup" "$out/gpu-tests.log"
fi

if [ "${PROFILE:-1}" = 1 ]; then
  echo "== kernel profile" | tee "$out/profile.log"
  h5=/tmp/scalestudy-profile
  rm -rf "$h5" && mkdir -p "$h5"
  common="train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank ${PROFILE_BATCH:-8} --steps 12
          --warmup-steps 3 --profile-kernels --profile-window 5-7 --experiment kernel-profile --log-every 4
          --strategy ddp --overlap on"
  for n in ${PROFILE_GPUS:-1 2}; do
    $mpirun -np "$n" "$binary" $common --output "$h5/profile-n$n.h5" 2>&1 | tee -a "$out/profile.log" | tail -8
  done
  "$binary" bench gemm --backend cuda --sizes 512,4096 --precisions bf16 --profile-kernels \
    -o "$h5/bench-gemm-traced.h5" 2>&1 | tee -a "$out/profile.log" | tail -4
  tar czf "$out/profile-h5.tgz" -C "$h5" .
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
    python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model "$model" --seq "$seq" --gpus ${TORCH_GPUS:-1 2} \
      --precision bf16 --batch-per-gpu "${TORCH_BATCH:-16}" --pytorch-gpus 1 \
      --pytorch-modes ${TORCH_MODES:-eager compile} --pytorch-precisions bf16 \
      --workdir "/tmp/vs-torch-$model" 2>&1 | tee -a "$out/vs-torch.log" | tail -14
  done
fi
