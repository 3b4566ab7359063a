#!/usr/bin/env bash
# Call 3 (8834434): every GPU test; --gemm-algos heuristic against timed (the whole
# device against 4 multiprocessors fewer, kept where 25 % faster) on one GPU, alternated;
# timed on 2 GPUs at --overlap-after 0 and 0.5; then the benchmark against PyTorch.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp3
log="$out/exp3.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
grep -E "TimedAlgorithmChoice|cuBLASLt's first" "$out/gpu-tests.log" | head -4 | tee -a "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
medium="--model gpt2-medium --batch-per-rank 32"
small="--model gpt2-small --batch-per-rank 64"
keep="median step|communication [0-9]|SM clock by phase|GEMM algorithms|^    (bias|gelu|dgelu)"
lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
one() { local label=$1; shift; CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $base "$@" 2>&1 | lines "$label"; }
for round in 1 2; do
  one "medium 1 GPU, heuristic" $medium --gemm-algos heuristic
  one "medium 1 GPU, timed" $medium --gemm-algos timed
  one "small 1 GPU, heuristic" $small --gemm-algos heuristic
  one "small 1 GPU, timed" $small --gemm-algos timed
done
two() { local label=$1; shift; $mpirun -np 2 "$binary" $base "$@" 2>&1 | lines "$label"; }
two "medium ddp+overlap, timed, after 0" $medium --strategy ddp --overlap on
two "medium ddp+overlap, timed, after 0.5" $medium --strategy ddp --overlap on --overlap-after 0.5
two "small ddp+overlap, timed, after 0" $small --strategy ddp --overlap on
two "small ddp+overlap, timed, after 0.5" $small --strategy ddp --overlap on --overlap-after 0.5
python3 jobscripts/bench_vs_pytorch.py --binary "$binary" --model gpt2-small --seq 1024 --gpus 1 2 --precision bf16 \
  --batch-per-gpu 64 --pytorch-gpus 1 --pytorch-modes compile --pytorch-precisions bf16 --workdir /tmp/vt \
  > "$out/vs-torch-small-b64.log" 2>&1
tail -14 "$out/vs-torch-small-b64.log"
