#!/usr/bin/env bash
# One call on a GPU machine: the step of GPT-2 small bf16 on GPUS GPUs (default 1) at
# BATCH per GPU (default 32) for each of BINARIES (executables in .gpu-bundle/, default
# "scalestudy"), each with each of VARIANTS (train options, variants separated by "|";
# default none), alternated ROUNDS times (default 2), so that a change is measured
# against the binary or the option before it on the same GPUs in the same call. Expects
# .gpu-bundle/ as jobscripts/gpu_check.sh does; writes ab.log under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-ab
log="$out/ab.log"
nvidia-smi --query-gpu=index,name,uuid --format=csv | tee "$log"
for name in ${BINARIES:-scalestudy}; do
  echo "$name: $("$bundle/$name" --version)" | tee -a "$log"
done
IFS='|' read -r -a variants <<< "${VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
for round in $(seq "${ROUNDS:-2}"); do
  for name in ${BINARIES:-scalestudy}; do
    for variant in "${variants[@]}"; do
      # The first round also keeps the GEMM algorithms each run chose.
      keep="median step"
      [ "$round" = 1 ] && keep="median step|GEMM algorithms|^    (bias|gelu|dgelu)"
      $mpirun -np "${GPUS:-1}" "$bundle/$name" $timed_train $variant 2>&1 | grep -E "$keep" |
        sed "s/^/[$name${variant:+ $variant}] /" | tee -a "$log"
    done
  done
done
