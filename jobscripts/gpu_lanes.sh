#!/usr/bin/env bash
# One call on a machine of 2 GPUs: the 2-GPU GPT-2 small bf16 step with overlap, for each
# of RUNS (";"-separated, each "STRATEGY CTAS [ENV=VALUE...]": --strategy, --overlapped-ctas,
# and environment variables for every rank), alternated ROUNDS times (default 2), with the
# binary BASE (a bundle executable without --overlapped-ctas, CTAS "-") for reference. With
# PROFILE=1 the first run is also traced (--profile-kernels) into $OUT/lanes-trace.h5.
# Expects .gpu-bundle/ as jobscripts/gpu_check.sh does; writes lanes.log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-lanes
log="$out/lanes.log"
nvidia-smi --query-gpu=index,name,uuid --format=csv | tee "$log"
echo "scalestudy: $("$binary" --version)" | tee -a "$log"
IFS=';' read -r -a runs <<< "${RUNS:-ddp 0;ddp 4}"
# mpirun's -x for each ENV=VALUE of a run.
exports_of() {
  local assignment
  for assignment in $1; do printf -- ' -x %s' "$assignment"; done
}
for round in $(seq "${ROUNDS:-2}"); do
  for run in "${runs[@]}"; do
    read -r strategy ctas envs <<< "$run"
    bin="$binary" options="--overlapped-ctas $ctas"
    [ "$ctas" = "-" ] && bin="$bundle/${BASE:-scalestudy}" options=""
    line=$($mpirun -np 2 $(exports_of "${envs:-}") "$bin" $timed_train --strategy "$strategy" --overlap on \
             $options 2>&1 | grep -E "median step|exposed" | tr -s ' ' | tr '\n' ' ')
    echo "[$run] $line" | tee -a "$log"
  done
done
if [ "${PROFILE:-0}" = 1 ]; then
  read -r strategy ctas envs <<< "${runs[0]}"
  $mpirun -np 2 $(exports_of "${envs:-}") "$binary" $timed_train --strategy "$strategy" --overlap on --overlapped-ctas "$ctas" \
    --profile-kernels --profile-window 6-8 -o "$out/lanes-trace.h5" 2>&1 | grep -E "median step|exposed" | tee -a "$log"
fi
