#!/usr/bin/env bash
set -uo pipefail
export BATCH=64
source jobscripts/gpu_env.sh /tmp/exp4
log="$out/exp4.log"
"$binary" --version | tee "$log"
lines() { grep -E "median step|communication [0-9]|GPU state" | sed "s/^/[$1] /" >> "$log"; }
for round in 1 2 3; do
  CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train 2>&1 | lines "GPU 0 alone"
  $mpirun -np 2 "$binary" $timed_train --strategy ddp --overlap on 2>&1 | lines "ddp+overlap"
  $mpirun -np 2 "$binary" $timed_train --strategy zero2 --overlap on 2>&1 | lines "zero2"
  $mpirun -np 2 -x SCALESTUDY_Z2_NO_FWD_RESERVE=1 "$binary" $timed_train --strategy zero2 --overlap on 2>&1 | lines "zero2 no-fwd-reserve"
  $mpirun -np 2 -x SCALESTUDY_Z2_GATHER_AWAITED=1 "$binary" $timed_train --strategy zero2 --overlap on 2>&1 | lines "zero2 gather-awaited"
  $mpirun -np 2 -x SCALESTUDY_Z2_NO_FWD_RESERVE=1 -x SCALESTUDY_Z2_GATHER_AWAITED=1 "$binary" $timed_train --strategy zero2 --overlap on 2>&1 | lines "zero2 both"
done
