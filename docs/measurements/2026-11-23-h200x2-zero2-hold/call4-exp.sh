#!/usr/bin/env bash
# Call 4 (the final C++): every GPU test; GPT-2 medium bf16 at batch 32 per GPU on GPU 0
# alone and with zero2+overlap at --overlap-after 0 and at its default (0.5 on 2 ranks),
# alternated twice; then the benchmark against PyTorch for GPT-2 small at batch 64.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp4
log="$out/exp4.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
medium="--model gpt2-medium --batch-per-rank 32"
keep="median step|communication [0-9]|SM clock by phase|peak memory"
lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
for round in 1 2; do
  CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $base $medium 2>&1 | lines "medium GPU 0 alone"
  $mpirun -np 2 "$binary" $base $medium --strategy zero2 --overlap on --overlap-after 0 2>&1 \
    | lines "medium zero2+overlap, after 0"
  $mpirun -np 2 "$binary" $base $medium --strategy zero2 --overlap on 2>&1 | lines "medium zero2+overlap, default"
done
timeout 200 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model gpt2-small --seq 1024 --gpus 1 2 \
  --precision bf16 --batch-per-gpu 64 --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 \
  --workdir /tmp/vt > "$out/vs-torch-small-b64.log" 2>&1
tail -8 "$out/vs-torch-small-b64.log" | tee -a "$log"
