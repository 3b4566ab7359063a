#!/usr/bin/env bash
# Call 5 (84521e1, on a fourth machine): the benchmark against PyTorch for GPT-2 small at
# batch 64, twice.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp5
log="$out/exp5.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
vs_torch() {  # vs_torch NAME MODEL SEQ BATCH
  timeout 200 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model "$2" --seq "$3" --gpus 1 2 \
    --precision bf16 --batch-per-gpu "$4" --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 \
    --workdir "/tmp/vt-$1" > "$out/vs-torch-$1.log" 2>&1
  tail -8 "$out/vs-torch-$1.log" | tee -a "$log"
}
vs_torch small-b64 gpt2-small 1024 64
vs_torch small-b64-run2 gpt2-small 1024 64
