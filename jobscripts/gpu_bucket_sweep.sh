#!/usr/bin/env bash
# One call on a 2-GPU machine: GPT-2 small bf16 with ddp+overlap and zero2+overlap at
# several bucket sizes (BUCKETS, MiB) and caps on the CTAs that NCCL's kernels take
# (CTAS, NCCL_MAX_CTAS; "default" leaves NCCL's choice), to see where the exposed
# communication is lowest and the step fastest. Expects .gpu-bundle/ as
# jobscripts/gpu_check.sh does; writes a table and the result files under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-bucket-sweep
mkdir -p "$out/runs"
"$binary" --version | tee "$out/bucket-sweep.log"
for ctas in ${CTAS:-default}; do
  cap=""
  [ "$ctas" = default ] || cap="-x NCCL_MAX_CTAS=$ctas"
  for strategy in ${STRATEGIES:-ddp zero2}; do
    for bucket_mb in ${BUCKETS:-5 12.5 25 50 100}; do
      label="$strategy bucket $bucket_mb MiB, NCCL CTAs $ctas"
      $mpirun $cap -np 2 "$binary" train --backend cuda --model gpt2-small --seq 1024 \
        --batch-per-rank ${BATCH:-16} --steps 14 --warmup-steps 4 --log-every 1000 --strategy $strategy \
        --overlap on --bucket-mb $bucket_mb --output "$out/runs/$strategy-$bucket_mb-ctas-$ctas.h5" 2>&1 |
        grep -E "median step|communication" | sed "s/^/$label: /" | tee -a "$out/bucket-sweep.log"
    done
  done
done
(cd "$out" && tar czf runs.tgz runs && rm -rf runs)
