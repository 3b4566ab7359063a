#!/usr/bin/env bash
# Call 5 (2c42214): GPT-2 medium bf16 at batch 32 per GPU on GPU 0 alone, and with
# ddp+overlap and zero2+overlap each at --overlap-after 0 and 0.5, alternated twice; then
# GPT-2 small at batch 64, zero2+overlap at 0 and 0.5, once.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp5
log="$out/exp5.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
medium="--model gpt2-medium --batch-per-rank 32"
small="--model gpt2-small --batch-per-rank 64"
keep="median step|communication [0-9]|peak memory"
lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
for round in 1 2; do
  CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $base $medium 2>&1 | lines "medium GPU 0 alone"
  for strategy in ddp zero2; do
    for after in 0 0.5; do
      $mpirun -np 2 "$binary" $base $medium --strategy $strategy --overlap on --overlap-after $after 2>&1 \
        | lines "medium $strategy+overlap, after $after"
    done
  done
done
for after in 0 0.5; do
  $mpirun -np 2 "$binary" $base $small --strategy zero2 --overlap on --overlap-after $after 2>&1 \
    | lines "small zero2+overlap, after $after"
done
