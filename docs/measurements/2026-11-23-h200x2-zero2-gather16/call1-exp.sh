#!/usr/bin/env bash
# Call 1 (84521e1: every 16-bit op reads the parameters' 16-bit copy, and zero2 gathers
# that copy; against the binary before it, 622eb3c-dirty, whose C++ is 304cde4's, carried
# as scalestudy-304cde4): every GPU test; then GPT-2 small bf16 at batch 64 per GPU:
# GPU 0 alone with each binary, and zero2+overlap and ddp+overlap with each binary,
# alternated two rounds.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp1
log="$out/exp1.log"
old="$bundle/scalestudy-304cde4"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; "$old" --version; } | tee "$log"
TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
small="--model gpt2-small --batch-per-rank 64"
lines() { grep -E "median step|communication [0-9]|SM clock by phase|peak memory" | sed "s/^/[$1] /" | tee -a "$log"; }
CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$old" $base $small 2>&1 | lines "GPU 0 alone, 304cde4"
CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $base $small 2>&1 | lines "GPU 0 alone, 84521e1"
for round in 1 2; do
  for strategy in zero2 ddp; do
    $mpirun -np 2 "$old" $base $small --strategy $strategy --overlap on 2>&1 | lines "$strategy+overlap, 304cde4"
    $mpirun -np 2 "$binary" $base $small --strategy $strategy --overlap on 2>&1 | lines "$strategy+overlap, 84521e1"
  done
done
