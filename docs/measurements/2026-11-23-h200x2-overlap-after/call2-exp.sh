#!/usr/bin/env bash
# Deferred-bucket experiment, 3 rounds: clocks and step per variant, batch 64; result files kept.
set -uo pipefail
export BATCH=64
source jobscripts/gpu_env.sh /tmp/exp2
log="$out/exp2.log"
h5=/tmp/exp2-h5; rm -rf $h5; mkdir -p $h5
nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
"$binary" --version | tee -a "$log"
s="--gpu-telemetry-ms 10"
lines() { grep -E "median step|GPU state|communication" | sed "s/^/[$1] /"; }
for round in 1 2 3; do
  for d in 0 1; do
    CUDA_VISIBLE_DEVICES=$d $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train $s --output $h5/r$round-gpu$d.h5 2>&1 | lines "GPU $d alone" | tee -a "$log"
  done
  $mpirun -np 2 "$binary" $timed_train $s --strategy ddp --overlap on --output $h5/r$round-ddp-on.h5 2>&1 | lines "ddp on" | tee -a "$log"
  $mpirun -np 2 "$binary" $timed_train $s --strategy ddp --overlap off --output $h5/r$round-ddp-off.h5 2>&1 | lines "ddp off" | tee -a "$log"
  for f in 0.4 0.5 0.6; do
    $mpirun -np 2 -x SCALESTUDY_DEFER_FRACTION=$f "$binary" $timed_train $s --strategy ddp --overlap on --output $h5/r$round-ddp-defer$f.h5 2>&1 | lines "ddp on defer $f" | tee -a "$log"
  done
  $mpirun -np 2 "$binary" $timed_train $s --strategy zero2 --overlap on --output $h5/r$round-zero2-on.h5 2>&1 | lines "zero2 on" | tee -a "$log"
done
tar czf $out/exp2-h5.tgz -C $h5 .
