#!/usr/bin/env bash
# Call 6 (3bdbfef: the buckets released by zero2's hold count on top of the in-flight
# bound; against 2c42214, the binary before it, carried as scalestudy-2c42214): the two
# 2-GPU tests; then zero2+overlap at --overlap-after 0.5 with each binary, alternated
# twice, on GPT-2 small (batch 64) and GPT-2 medium (batch 32), and GPT-2 medium at 0 with
# the new binary; GPU 0 alone on GPT-2 small once.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp6
log="$out/exp6.log"
old="$bundle/scalestudy-2c42214"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; "$old" --version; } | tee "$log"
GPU_TESTS=" " TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
small="--model gpt2-small --batch-per-rank 64"
medium="--model gpt2-medium --batch-per-rank 32"
keep="median step|communication [0-9]|peak memory"
lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
zero2="--strategy zero2 --overlap on"
CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $base $small 2>&1 | lines "small GPU 0 alone"
for round in 1 2; do
  $mpirun -np 2 "$old" $base $small $zero2 --overlap-after 0.5 2>&1 | lines "small zero2 0.5, 2c42214"
  $mpirun -np 2 "$binary" $base $small $zero2 --overlap-after 0.5 2>&1 | lines "small zero2 0.5, 3bdbfef"
done
for round in 1 2; do
  $mpirun -np 2 "$old" $base $medium $zero2 --overlap-after 0.5 2>&1 | lines "medium zero2 0.5, 2c42214"
  $mpirun -np 2 "$binary" $base $medium $zero2 --overlap-after 0.5 2>&1 | lines "medium zero2 0.5, 3bdbfef"
  $mpirun -np 2 "$binary" $base $medium $zero2 --overlap-after 0 2>&1 | lines "medium zero2 0, 3bdbfef"
done
