#!/usr/bin/env bash
# One call on a machine of 2 GPUs: the one-GPU step of GPT-2 small bf16 on each GPU alone,
# then on both GPUs at once as two independent one-GPU runs (no communication between
# them), then the 2-GPU ddp+overlap step, alternated ROUNDS times (default 2). It separates
# what running both GPUs at once costs each of them from what the communication costs.
# Expects .gpu-bundle/ as jobscripts/gpu_check.sh does; writes concurrent.log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-concurrent
log="$out/concurrent.log"
nvidia-smi --query-gpu=index,name,uuid --format=csv | tee "$log"
echo "scalestudy: $("$binary" --version)" | tee -a "$log"
one_gpu() {  # one_gpu DEVICE LABEL
  CUDA_VISIBLE_DEVICES=$1 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train 2>&1 |
    grep "median step" | sed "s/^/[$2] /"
}
for round in $(seq "${ROUNDS:-2}"); do
  one_gpu 0 "GPU 0 alone" | tee -a "$log"
  one_gpu 1 "GPU 1 alone" | tee -a "$log"
  one_gpu 0 "GPU 0 beside GPU 1" > "$out/.beside0" &
  one_gpu 1 "GPU 1 beside GPU 0" > "$out/.beside1" &
  wait
  cat "$out/.beside0" "$out/.beside1" | tee -a "$log"
  $mpirun -np 2 "$binary" $timed_train --strategy ddp --overlap on 2>&1 | grep "median step" |
    sed "s/^/[2 GPUs ddp+overlap] /" | tee -a "$log"
done
rm -f "$out/.beside0" "$out/.beside1"
