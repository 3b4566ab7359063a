#!/usr/bin/env bash
# Call 3 (84521e1, on another machine than calls 1 and 2; against scalestudy-304cde4 as in
# call 1): zero2+overlap with each binary, alternated two rounds, GPT-2 small bf16 at batch
# 64 per GPU; then the benchmark against PyTorch for GPT-2 small at batch 64 twice.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp3
log="$out/exp3.log"
old="$bundle/scalestudy-304cde4"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; "$old" --version; } | tee "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
small="--model gpt2-small --batch-per-rank 64"
lines() { grep -E "median step|communication [0-9]|SM clock by phase" | sed "s/^/[$1] /" | tee -a "$log"; }
for round in 1 2; do
  $mpirun -np 2 "$old" $base $small --strategy zero2 --overlap on 2>&1 | lines "zero2+overlap, 304cde4"
  $mpirun -np 2 "$binary" $base $small --strategy zero2 --overlap on 2>&1 | lines "zero2+overlap, 84521e1"
done
vs_torch() {  # vs_torch NAME MODEL SEQ BATCH
  timeout 200 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model "$2" --seq "$3" --gpus 1 2 \
    --precision bf16 --batch-per-gpu "$4" --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 \
    --workdir "/tmp/vt-$1" > "$out/vs-torch-$1.log" 2>&1
  tail -8 "$out/vs-torch-$1.log" | tee -a "$log"
}
vs_torch small-b64 gpt2-small 1024 64
vs_torch small-b64-run2 gpt2-small 1024 64
