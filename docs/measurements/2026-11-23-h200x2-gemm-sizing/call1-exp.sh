#!/usr/bin/env bash
# Call 1: every GPU test at main, then GPT-2 medium (batch 32) and small (batch 64) on one
# GPU with every GEMM sized for all 132 multiprocessors (main) and for 128 (the scratch
# binary, SCALESTUDY_SCRATCH_GEMM_TARGET=128), alternated; one traced run of each for the
# kernels' times; medium's ddp+overlap on 2 GPUs both ways.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp1
log="$out/exp1.log"
h5=/tmp/exp1-h5; rm -rf "$h5"; mkdir -p "$h5"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; "$bundle/scalestudy-scratch" --version; } | tee "$log"
TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
lines() { grep -E "median step|communication [0-9]|SM clock by phase|GPU state" | sed "s/^/[$1] /" | tee -a "$log"; }
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4"
medium="--model gpt2-medium --batch-per-rank 32"
small="--model gpt2-small --batch-per-rank 64"
one() {  # one LABEL BINARY TARGET options...
  local label=$1 bin=$2 target=$3; shift 3
  CUDA_VISIBLE_DEVICES=0 SCALESTUDY_SCRATCH_GEMM_TARGET=$target $mpirun -np 1 -x CUDA_VISIBLE_DEVICES \
    -x SCALESTUDY_SCRATCH_GEMM_TARGET "$bundle/$bin" $base --gpu-telemetry-ms 10 "$@" 2>&1 | lines "$label"
}
for round in 1 2 3; do
  one "medium 1 GPU, 132" scalestudy 0 $medium
  one "medium 1 GPU, 128" scalestudy-scratch 128 $medium
  one "small 1 GPU, 132" scalestudy 0 $small
  one "small 1 GPU, 128" scalestudy-scratch 128 $small
done
for round in 1 2; do
  $mpirun -np 2 "$binary" $base $medium --gpu-telemetry-ms 10 --strategy ddp --overlap on 2>&1 | lines "medium ddp, 132 outside the lane"
  SCALESTUDY_SCRATCH_GEMM_TARGET=128 $mpirun -np 2 -x SCALESTUDY_SCRATCH_GEMM_TARGET "$bundle/scalestudy-scratch" $base $medium \
    --gpu-telemetry-ms 10 --strategy ddp --overlap on 2>&1 | lines "medium ddp, 128 throughout"
done
trace="--profile-kernels --profile-window 5-6 --steps 8 --warmup-steps 3 --log-every 1000"
for target in 0 128; do
  bin=scalestudy; [ $target = 128 ] && bin=scalestudy-scratch
  CUDA_VISIBLE_DEVICES=0 SCALESTUDY_SCRATCH_GEMM_TARGET=$target $mpirun -np 1 -x CUDA_VISIBLE_DEVICES -x SCALESTUDY_SCRATCH_GEMM_TARGET \
    "$bundle/$bin" train --backend cuda --model gpt2-medium --seq 1024 --batch-per-rank 32 $trace \
    --output "$h5/medium-t$target.h5" 2>&1 | lines "traced medium, target $target"
  CUDA_VISIBLE_DEVICES=0 SCALESTUDY_SCRATCH_GEMM_TARGET=$target $mpirun -np 1 -x CUDA_VISIBLE_DEVICES -x SCALESTUDY_SCRATCH_GEMM_TARGET \
    "$bundle/$bin" train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank 64 $trace \
    --output "$h5/small-t$target.h5" 2>&1 | lines "traced small, target $target"
done
tar czf "$out/exp1-h5.tgz" -C "$h5" .
