#!/usr/bin/env bash
# One call on a machine of 2 GPUs: the one-GPU step of GPT-2 small bf16 on each GPU alone,
# then on both GPUs at once as two independent one-GPU runs (no communication between
# them), then the 2-GPU ddp+overlap step, alternated ROUNDS times (default 2). It separates
# what running both GPUs at once costs each of them from what the communication costs.
# With CLOCKS=1, nvidia-smi samples each GPU's SM clock, power and throttle reasons every
# 100 ms into clocks.csv (it only reads them), and each run's start and end go into
# concurrent.log as Unix times. Expects .gpu-bundle/ as jobscripts/gpu_check.sh does;
# writes concurrent.log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-concurrent
log="$out/concurrent.log"
nvidia-smi --query-gpu=index,name,uuid --format=csv | tee "$log"
echo "scalestudy: $("$binary" --version)" | tee -a "$log"
if [ "${CLOCKS:-0}" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 100 > "$out/clocks.csv" &
  sampler=$!
fi
stamp() { echo "# $1 at $(date +%s.%N)" >> "$log"; }
one_gpu() {  # one_gpu DEVICE LABEL
  CUDA_VISIBLE_DEVICES=$1 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train 2>&1 |
    grep "median step" | sed "s/^/[$2] /"
}
for round in $(seq "${ROUNDS:-2}"); do
  stamp "alone start"
  one_gpu 0 "GPU 0 alone" | tee -a "$log"
  one_gpu 1 "GPU 1 alone" | tee -a "$log"
  stamp "beside start"
  one_gpu 0 "GPU 0 beside GPU 1" > "$out/.beside0" &
  beside0=$!
  one_gpu 1 "GPU 1 beside GPU 0" > "$out/.beside1" &
  wait "$beside0" $!
  cat "$out/.beside0" "$out/.beside1" | tee -a "$log"
  stamp "2 GPUs start"
  $mpirun -np 2 "$binary" $timed_train --strategy ddp --overlap on 2>&1 | grep "median step" |
    sed "s/^/[2 GPUs ddp+overlap] /" | tee -a "$log"
  stamp "round end"
done
rm -f "$out/.beside0" "$out/.beside1"
[ -n "${sampler:-}" ] && kill "$sampler"
