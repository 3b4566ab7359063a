#!/usr/bin/env bash
# One call on a 2-GPU machine: where the 2-GPU step loses time against the 1-GPU one.
# GPT-2 small bf16 at BATCH per GPU (default 32): one GPU alone (each of the two), both
# GPUs training independently at once (no communication), ddp with overlap off and on,
# and the 1- and 2-GPU runs again with --profile-kernels for the kernel-level comparison.
# Expects .gpu-bundle/ as jobscripts/gpu_check.sh does; writes a log and the result files
# under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-overlap-check
mkdir -p "$out/runs"
log="$out/overlap-check.log"
"$binary" --version | tee "$log"
report() { grep -E "median step|communication" | sed "s/^/$1: /" | tee -a "$log"; }

for gpu in 0 1; do
  CUDA_VISIBLE_DEVICES=$gpu $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train \
    --output "$out/runs/alone-gpu$gpu.h5" 2>&1 | report "1 GPU alone (GPU $gpu)"
done
for gpu in 0 1; do
  CUDA_VISIBLE_DEVICES=$gpu $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train \
    --output "$out/runs/together-gpu$gpu.h5" >"$out/together-gpu$gpu.txt" 2>&1 &
done
wait
for gpu in 0 1; do report "1 GPU while the other GPU trains too (GPU $gpu)" <"$out/together-gpu$gpu.txt"; done
for overlap in off on; do
  $mpirun -np 2 "$binary" $timed_train --strategy ddp --overlap $overlap \
    --output "$out/runs/ddp-overlap-$overlap.h5" 2>&1 | report "2 GPUs ddp, overlap $overlap"
done
for n in 1 2; do
  $mpirun -np $n "$binary" $timed_train --strategy ddp --overlap on --profile-kernels --profile-window 6-8 \
    --output "$out/runs/profile-n$n.h5" 2>&1 | report "$n GPU(s) ddp+overlap, kernels traced"
done
(cd "$out" && tar czf runs.tgz runs && rm -rf runs together-gpu*.txt)
