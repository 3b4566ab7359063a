#!/usr/bin/env bash
# Call 5 (a2e363c, the same executables as call 4): the benchmark against PyTorch for
# bert-large (seq 512, batch 32) and a second run for GPT-2 small (batch 64).
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp5
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$out/machine.txt"
timeout 200 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model bert-large --seq 512 --gpus 1 2 --precision bf16 \
  --batch-per-gpu 32 --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 --workdir /tmp/vtb \
  > "$out/vs-torch-bert-large-b32.log" 2>&1
tail -8 "$out/vs-torch-bert-large-b32.log"
timeout 150 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model gpt2-small --seq 1024 --gpus 1 2 --precision bf16 \
  --batch-per-gpu 64 --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 --workdir /tmp/vt \
  > "$out/vs-torch-small-b64-run2.log" 2>&1
tail -8 "$out/vs-torch-small-b64-run2.log"
