#!/usr/bin/env bash
# One call on a machine of 2 GPUs: the step of GPT-2 small bf16 at BATCH per GPU (default
# 64) with each rank's GPU state recorded (--gpu-telemetry-ms PERIOD, default 10): on GPU 0
# alone, on GPU 1 alone, on both at once as two independent one-GPU runs (no
# communication), and on both with ddp+overlap and zero2+overlap; then GPU 0 alone with
# the sampling off, to see what it costs. Alternated ROUNDS times (default 2). Prints each
# run's median step and GPU-state lines into state.log, and keeps the result files in
# state-h5.tgz (read them with scalestudy-report DIR). Expects .gpu-bundle/ as
# jobscripts/gpu_check.sh does; writes under $OUT.
set -uo pipefail
export BATCH=${BATCH:-64}
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-state
log="$out/state.log"
h5=/tmp/scalestudy-state-h5
rm -rf "$h5" && mkdir -p "$h5"
nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
echo "scalestudy: $("$binary" --version), batch $BATCH per GPU" | tee -a "$log"
sampled="--gpu-telemetry-ms ${PERIOD:-10}"
lines() {  # lines LABEL: the run's figures, labelled
  grep -E "median step|GPU state" | sed "s/^/[$1] /"
}
one_gpu() {  # one_gpu DEVICE LABEL FILE [options]
  local device=$1 label=$2 file=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$device $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train "$@" \
    --output "$h5/$file.h5" 2>&1 | lines "$label"
}
for round in $(seq "${ROUNDS:-2}"); do
  one_gpu 0 "GPU 0 alone" "r$round-gpu0-alone" $sampled | tee -a "$log"
  one_gpu 1 "GPU 1 alone" "r$round-gpu1-alone" $sampled | tee -a "$log"
  one_gpu 0 "GPU 0 beside GPU 1" "r$round-gpu0-beside" $sampled > "$out/.beside0" &
  beside0=$!
  one_gpu 1 "GPU 1 beside GPU 0" "r$round-gpu1-beside" $sampled > "$out/.beside1" &
  wait "$beside0" $!
  cat "$out/.beside0" "$out/.beside1" | tee -a "$log"
  for strategy in ddp zero2; do
    $mpirun -np 2 "$binary" $timed_train --strategy "$strategy" --overlap on $sampled \
      --output "$h5/r$round-2gpu-$strategy.h5" 2>&1 | lines "2 GPUs $strategy+overlap" | tee -a "$log"
  done
  one_gpu 0 "GPU 0 alone, not sampled" "r$round-gpu0-unsampled" --gpu-telemetry-ms 0 | tee -a "$log"
done
rm -f "$out/.beside0" "$out/.beside1"
tar czf "$out/state-h5.tgz" -C "$h5" .
