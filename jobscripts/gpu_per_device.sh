#!/usr/bin/env bash
# One call on a machine of several GPUs: the one-GPU step of GPT-2 small bf16 at BATCH per
# GPU (default 32) on each visible GPU alone, in turn, REPEATS times (default 3). The
# one-GPU baseline of a scaling run uses GPU 0, while a data-parallel step waits for its
# slowest GPU: this shows how far apart the machine's GPUs are. Expects .gpu-bundle/ as
# jobscripts/gpu_check.sh does; writes per-device.log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-per-device
log="$out/per-device.log"
"$binary" --version | tee "$log"
nvidia-smi --query-gpu=index,name,pci.bus_id,clocks.max.sm,power.limit --format=csv | tee -a "$log"
for repeat in $(seq "${REPEATS:-3}"); do
  for gpu in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
    CUDA_VISIBLE_DEVICES=$gpu $mpirun -x CUDA_VISIBLE_DEVICES -np 1 "$binary" $timed_train 2>&1 |
      grep "median step" | sed "s/^/[GPU $gpu alone] /" | tee -a "$log"
  done
done
