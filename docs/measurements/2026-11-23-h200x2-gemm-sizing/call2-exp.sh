#!/usr/bin/env bash
# Call 2 (068cf2f): every GPU test; every cuBLASLt candidate of GPT-2 small's and medium's
# epilogue GEMMs at both multiprocessor targets; then --gemm-algos heuristic against
# timed on one GPU (medium batch 32, small batch 64), and timed on 2 GPUs, alternated.
set -uo pipefail
source jobscripts/gpu_env.sh /tmp/exp2
log="$out/exp2.log"
{ nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv; "$binary" --version; } | tee "$log"
TESTS=1 PROFILE=0 THROUGHPUT=0 VS_TORCH=0 OUT=$out bash jobscripts/gpu_profile.sh > /dev/null 2>&1
grep -E "exit|^\[  (PASSED|FAILED)" "$out/gpu-tests.log" | tee -a "$log"
SCALESTUDY_GPU_TIMING=1 timeout 300 "$bundle/test_cuda_ops_half_gpt2" --gtest_filter='*EpilogueGemmCandidateTimings*' \
  > "$out/candidates.log" 2>&1
echo "candidates: exit $?" | tee -a "$log"
base="train --backend cuda --seq 1024 --log-every 1000 --steps 14 --warmup-steps 4 --gpu-telemetry-ms 10"
medium="--model gpt2-medium --batch-per-rank 32"
small="--model gpt2-small --batch-per-rank 64"
keep="median step|communication [0-9]|SM clock by phase"
for round in 1 2; do
  [ $round = 1 ] && keep="$keep|GEMM algorithms|^    (bias|gelu|dgelu)"
  lines() { grep -E "$keep" | sed "s/^/[$1] /" | tee -a "$log"; }
  one() { local label=$1; shift; CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $base "$@" 2>&1 | lines "$label"; }
  one "medium 1 GPU, heuristic" $medium --gemm-algos heuristic
  one "medium 1 GPU, timed" $medium --gemm-algos timed
  one "small 1 GPU, heuristic" $small --gemm-algos heuristic
  one "small 1 GPU, timed" $small --gemm-algos timed
  $mpirun -np 2 "$binary" $base $medium --strategy ddp --overlap on 2>&1 | lines "medium ddp+overlap, timed, after 0"
  $mpirun -np 2 "$binary" $base $medium --strategy ddp --overlap on --overlap-after 0.5 2>&1 | lines "medium ddp+overlap, timed, after 0.5"
  $mpirun -np 2 "$binary" $base $small --strategy ddp --overlap on 2>&1 | lines "small ddp+overlap, timed, after 0"
  $mpirun -np 2 "$binary" $base $small --strategy ddp --overlap on --overlap-after 0.5 2>&1 | lines "small ddp+overlap, timed, after 0.5"
  $mpirun -np 2 "$binary" $base $small --strategy zero2 --overlap on 2>&1 | lines "small zero2+overlap, timed"
done
