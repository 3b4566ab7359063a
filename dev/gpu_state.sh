#!/usr/bin/env bash
# What communication costs a power-capped GPU: the step of GPT-2 small bf16 at BATCH per
# GPU (default 64) with each rank's GPU state sampled every PERIOD ms (default 10) on GPU 0
# alone, on GPU 1 alone, on both at once as two independent one-GPU runs (no
# communication), and on both with ddp+overlap and zero2+overlap; then GPU 0 alone without
# sampling, to show what sampling costs. Alternated ROUNDS times (default 2). Prints each
# run's median step and GPU state into state.log, and keeps the result files in
# OUTPUT_DIR/runs/ (scalestudy-report OUTPUT_DIR/runs -o REPORT_DIR reads them).
#   dev/gpu_state.sh OUTPUT_DIR
set -uo pipefail
export BATCH=${BATCH:-64}
source "$(dirname "$0")/gpu_env.sh" "${1:-}"
log="$out/state.log"
runs="$out/runs"
mkdir -p "$runs"
nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
echo "scalestudy: $("$binary" --version), batch $BATCH per GPU" | tee -a "$log"
sampled="--gpu-telemetry-ms ${PERIOD:-10}"
lines() {  # lines LABEL: the run's figures, labelled
  grep -E "median step|GPU state|SM clock by phase" | sed "s/^/[$1] /"
}
one_gpu() {  # one_gpu DEVICE LABEL FILE [options]
  local device=$1 label=$2 file=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$device $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train "$@" \
    --output "$runs/$file.h5" 2>&1 | lines "$label"
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
      --output "$runs/r$round-2gpu-$strategy.h5" 2>&1 | lines "2 GPUs $strategy+overlap" | tee -a "$log"
  done
  one_gpu 0 "GPU 0 alone, not sampled" "r$round-gpu0-unsampled" --gpu-telemetry-ms 0 | tee -a "$log"
done
rm -f "$out/.beside0" "$out/.beside1"
