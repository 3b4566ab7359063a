#!/usr/bin/env bash
# Call 2 (84521e1, on the machine of call 1): the benchmark against PyTorch, GPT-2 small
# at batch 64 twice, GPT-2 medium at batch 32, bert-large at seq 512 and batch 32.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp2
log="$out/exp2.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
vs_torch() {  # vs_torch NAME MODEL SEQ BATCH
  timeout 200 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model "$2" --seq "$3" --gpus 1 2 \
    --precision bf16 --batch-per-gpu "$4" --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 \
    --workdir "/tmp/vt-$1" > "$out/vs-torch-$1.log" 2>&1
  tail -8 "$out/vs-torch-$1.log" | tee -a "$log"
}
vs_torch small-b64 gpt2-small 1024 64
vs_torch small-b64-run2 gpt2-small 1024 64
vs_torch medium-b32 gpt2-medium 1024 32
vs_torch bert-large-b32 bert-large 512 32
