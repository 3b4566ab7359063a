#!/usr/bin/env bash
# One call on a 2-GPU machine: the 2-GPU step under communication settings. GPT-2 small
# bf16 at BATCH per GPU (default 32), one GPU alone first, then for each entry of SETTINGS
# (entries separated by ';'; "default" sets nothing) ddp with overlap off and on, and zero2
# with overlap on, each a separate mpirun. In an entry, NAME=value words are exported to
# every rank (NCCL's variables) and the other words are added to the train command
# (e.g. "--grad-reduce bf16"). REPEATS runs each point that many times. Expects
# .gpu-bundle/ as jobscripts/gpu_check.sh does; writes comm-settings.log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-comm-settings
log="$out/comm-settings.log"
"$binary" --version | tee "$log"
report() { grep -E "median step|communication" | sed "s/^/[$1] /" | tee -a "$log"; }

for repeat in $(seq "${REPEATS:-1}"); do
  $mpirun -np 1 "$binary" $timed_train 2>&1 | report "1 GPU"
done
IFS=';' read -ra settings <<<"${SETTINGS:-default;NCCL_CTA_POLICY=1}"
for setting in "${settings[@]}"; do
  setting=$(echo "$setting" | xargs)
  exports=() options=()
  if [ "$setting" != default ]; then
    for word in $setting; do
      case "$word" in
        *=*) exports+=(-x "$word") ;;
        *) options+=("$word") ;;
      esac
    done
  fi
  for repeat in $(seq "${REPEATS:-1}"); do
    for run in "ddp off" "ddp on" "zero2 on"; do
      set -- $run
      $mpirun "${exports[@]}" -np 2 "$binary" $timed_train "${options[@]}" --strategy "$1" --overlap "$2" 2>&1 |
        report "$setting, $1 overlap $2"
    done
  done
done
