#!/usr/bin/env bash
# Call 3 (cc1c822): GPT-2 small bf16 at batch 64 per GPU on GPU 0 alone, GPU 1 alone,
# ddp+overlap at its default, and zero2+overlap at --overlap-after 0 and at its default
# (auto, 0.5 on 2 ranks), alternated three rounds; then the benchmark against PyTorch for
# GPT-2 small at batch 64, twice.
set -uo pipefail
export BATCH=64
source jobscripts/gpu_env.sh /tmp/exp3
log="$out/exp3.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
keep="median step|communication [0-9]|SM clock by phase|peak memory"
lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
for round in 1 2 3; do
  for gpu in 0 1; do
    CUDA_VISIBLE_DEVICES=$gpu $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train --gpu-telemetry-ms 10 2>&1 \
      | lines "GPU $gpu alone"
  done
  $mpirun -np 2 "$binary" $timed_train --gpu-telemetry-ms 10 --strategy ddp --overlap on 2>&1 \
    | lines "ddp+overlap, default"
  $mpirun -np 2 "$binary" $timed_train --gpu-telemetry-ms 10 --strategy zero2 --overlap on --overlap-after 0 2>&1 \
    | lines "zero2+overlap, after 0"
  $mpirun -np 2 "$binary" $timed_train --gpu-telemetry-ms 10 --strategy zero2 --overlap on 2>&1 \
    | lines "zero2+overlap, default"
done
for run in 1 2; do
  timeout 200 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model gpt2-small --seq 1024 --gpus 1 2 \
    --precision bf16 --batch-per-gpu 64 --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 \
    --workdir "/tmp/vt-$run" > "$out/vs-torch-small-b64-run$run.log" 2>&1
  tail -8 "$out/vs-torch-small-b64-run$run.log" | tee -a "$log"
done
