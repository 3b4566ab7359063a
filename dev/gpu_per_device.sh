#!/usr/bin/env bash
# The one-GPU step of GPT-2 small bf16 at BATCH per GPU (default 32) on each visible GPU
# alone, in turn, REPEATS times (default 3). A scaling study's one-GPU baseline runs on
# GPU 0, while a data-parallel step waits for its slowest GPU: this shows how far apart
# the node's GPUs are. Writes per-device.log into OUTPUT_DIR.
#   dev/gpu_per_device.sh OUTPUT_DIR
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" "${1:-}"
log="$out/per-device.log"
"$binary" --version | tee "$log"
nvidia-smi --query-gpu=index,name,pci.bus_id,clocks.max.sm,power.limit --format=csv | tee -a "$log"
for repeat in $(seq "${REPEATS:-3}"); do
  for gpu in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
    CUDA_VISIBLE_DEVICES=$gpu $mpirun -x CUDA_VISIBLE_DEVICES -np 1 "$binary" $timed_train 2>&1 |
      grep "median step" | sed "s/^/[GPU $gpu alone] /" | tee -a "$log"
  done
done
