#!/usr/bin/env bash
# One call on a machine of 2 GPUs: the step of GPT-2 small bf16 at BATCH per GPU (default
# 64) on GPU 0 alone, on GPU 1 alone, with ddp+overlap at each --overlap-after of VALUES
# (default "0 0.4 0.5 0.6"), with ddp and overlap off, and with zero2+overlap, alternated
# ROUNDS times (default 3), each rank's GPU state sampled every 10 ms. Prints each run's
# median step, communication, GPU state and clock by phase into overlap-after.log and
# keeps the result files in overlap-after-h5.tgz (read them with scalestudy-report DIR).
# Expects .gpu-bundle/ as jobscripts/gpu_check.sh does; writes under $OUT.
set -uo pipefail
export BATCH=${BATCH:-64}
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-overlap-after
log="$out/overlap-after.log"
h5=/tmp/scalestudy-overlap-after-h5
rm -rf "$h5" && mkdir -p "$h5"
nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
echo "scalestudy: $("$binary" --version), batch $BATCH per GPU" | tee -a "$log"
lines() {  # lines LABEL: the run's figures, labelled
  grep -E "median step|communication [0-9]|GPU state|SM clock by phase" | sed "s/^/[$1] /" | tee -a "$log"
}
run() {  # run LABEL FILE RANKS [options]: RANKS 0 or 1 is that GPU alone, 2 both GPUs
  local label=$1 file=$2 ranks=$3
  shift 3
  if [ "$ranks" = 2 ]; then
    $mpirun -np 2 "$binary" $timed_train --gpu-telemetry-ms 10 --output "$h5/$file.h5" "$@" 2>&1 | lines "$label"
  else
    CUDA_VISIBLE_DEVICES=$ranks $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train --gpu-telemetry-ms 10 \
      --output "$h5/$file.h5" "$@" 2>&1 | lines "$label"
  fi
}
for round in $(seq "${ROUNDS:-3}"); do
  run "GPU 0 alone" "r$round-gpu0" 0
  run "GPU 1 alone" "r$round-gpu1" 1
  for value in ${VALUES:-0 0.4 0.5 0.6}; do
    run "ddp+overlap, --overlap-after $value" "r$round-ddp-after$value" 2 --strategy ddp --overlap on --overlap-after "$value"
  done
  run "ddp, overlap off" "r$round-ddp-off" 2 --strategy ddp --overlap off
  run "zero2+overlap" "r$round-zero2" 2 --strategy zero2 --overlap on
done
tar czf "$out/overlap-after-h5.tgz" -C "$h5" .
