#!/usr/bin/env bash
# Deferred-bucket experiment: clocks and step per variant, batch 64, 2 rounds.
set -uo pipefail
export BATCH=64
source jobscripts/gpu_env.sh /tmp/exp1
log="$out/exp1.log"
nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
"$binary" --version | tee -a "$log"
s="--gpu-telemetry-ms 10"
lines() { grep -E "median step|GPU state|communication" | sed "s/^/[$1] /"; }
for round in 1 2; do
  CUDA_VISIBLE_DEVICES=0 $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train $s 2>&1 | lines "GPU 0 alone" | tee -a "$log"
  $mpirun -np 2 "$binary" $timed_train $s --strategy ddp --overlap off 2>&1 | lines "ddp off" | tee -a "$log"
  $mpirun -np 2 "$binary" $timed_train $s --strategy ddp --overlap on 2>&1 | lines "ddp on" | tee -a "$log"
  for f in 0.3 0.5; do
    $mpirun -np 2 -x SCALESTUDY_DEFER_FRACTION=$f "$binary" $timed_train $s --strategy ddp --overlap on 2>&1 | lines "ddp on defer $f" | tee -a "$log"
  done
  $mpirun -np 2 -x SCALESTUDY_DEFER_FRACTION=0.3 "$binary" $timed_train $s --strategy ddp --overlap on --overlapped-ctas 0 2>&1 | lines "ddp on defer 0.3 ctas 0" | tee -a "$log"
  $mpirun -np 2 "$binary" $timed_train $s --strategy zero2 --overlap on 2>&1 | lines "zero2 on" | tee -a "$log"
  $mpirun -np 2 "$binary" $timed_train $s --strategy zero2 --overlap off 2>&1 | lines "zero2 off" | tee -a "$log"
done
