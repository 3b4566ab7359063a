#!/usr/bin/env bash
# Call 4 (84521e1, on a third machine; against scalestudy-304cde4 as in call 1): the
# benchmark against PyTorch for GPT-2 small at batch 64 twice; then zero2+overlap on GPT-2
# medium bf16 at batch 32 with each binary, alternated two rounds.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp4
log="$out/exp4.log"
old="$bundle/scalestudy-304cde4"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; "$old" --version; } | tee "$log"
vs_torch() {  # vs_torch NAME MODEL SEQ BATCH
  timeout 200 python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model "$2" --seq "$3" --gpus 1 2 \
    --precision bf16 --batch-per-gpu "$4" --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 \
    --workdir "/tmp/vt-$1" > "$out/vs-torch-$1.log" 2>&1
  tail -8 "$out/vs-torch-$1.log" | tee -a "$log"
}
vs_torch small-b64 gpt2-small 1024 64
vs_torch small-b64-run2 gpt2-small 1024 64
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
medium="--model gpt2-medium --batch-per-rank 32"
lines() { grep -E "median step|communication [0-9]" | sed "s/^/[$1] /" | tee -a "$log"; }
for round in 1 2; do
  $mpirun -np 2 "$old" $base $medium --strategy zero2 --overlap on 2>&1 | lines "medium zero2+overlap, 304cde4"
  $mpirun -np 2 "$binary" $base $medium --strategy zero2 --overlap on 2>&1 | lines "medium zero2+overlap, 84521e1"
done
