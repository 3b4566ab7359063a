#!/usr/bin/env bash
# Call 4 (a2e363c, the defaults --gemm-algos timed and --overlap-after auto = 0.5 for ddp):
# every GPU test; GPT-2 medium (batch 32) on one GPU and with ddp+overlap on 2 at the
# default and at --overlap-after 0, alternated twice; then the benchmark against PyTorch
# for GPT-2 small (batch 64) and medium (batch 32).
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp4
log="$out/exp4.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
medium="--model gpt2-medium --batch-per-rank 32"
keep="median step|communication [0-9]|SM clock by phase"
lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
for round in 1 2; do
  CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $base $medium 2>&1 | lines "medium 1 GPU"
  $mpirun -np 2 "$binary" $base $medium --strategy ddp --overlap on 2>&1 | lines "medium ddp+overlap, default (0.5)"
  $mpirun -np 2 "$binary" $base $medium --strategy ddp --overlap on --overlap-after 0 2>&1 | lines "medium ddp+overlap, after 0"
done
python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model gpt2-small --seq 1024 --gpus 1 2 --precision bf16 \
  --batch-per-gpu 64 --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 --workdir /tmp/vt \
  > "$out/vs-torch-small-b64.log" 2>&1
tail -8 "$out/vs-torch-small-b64.log"
timeout 240 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model gpt2-medium --seq 1024 --gpus 1 2 --precision bf16 \
  --batch-per-gpu 32 --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 --workdir /tmp/vtm \
  > "$out/vs-torch-medium-b32.log" 2>&1
tail -8 "$out/vs-torch-medium-b32.log"
