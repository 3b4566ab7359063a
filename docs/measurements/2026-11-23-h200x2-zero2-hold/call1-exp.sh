#!/usr/bin/env bash
# Call 1: every GPU test; then GPT-2 small bf16 at batch 64 per GPU: GPU 0 alone,
# ddp+overlap at its default (--overlap-after 0.5) and zero2+overlap at --overlap-after
# 0, 0.25, 0.5 and 0.75, alternated three rounds, each with its memory report.
set -uo pipefail
export BATCH=64
source jobscripts/gpu_env.sh /tmp/exp1
log="$out/exp1.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
keep="median step|communication [0-9]|SM clock by phase|peak memory|memory per rank"
lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
for round in 1 2 3; do
  CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train --gpu-telemetry-ms 10 2>&1 \
    | lines "GPU 0 alone"
  $mpirun -np 2 "$binary" $timed_train --gpu-telemetry-ms 10 --strategy ddp --overlap on 2>&1 \
    | lines "ddp+overlap, default"
  for value in 0 0.25 0.5 0.75; do
    $mpirun -np 2 "$binary" $timed_train --gpu-telemetry-ms 10 --strategy zero2 --overlap on --overlap-after "$value" 2>&1 \
      | lines "zero2+overlap, after $value"
  done
done
