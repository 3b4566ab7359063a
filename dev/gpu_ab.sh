#!/usr/bin/env bash
# A/B on a GPU node: the GPT-2 small bf16 step on GPUS GPUs (default 1) at BATCH per GPU
# (default 32) for each of BINARIES (executables in the bundle, default "scalestudy"), each
# with each of VARIANTS (train options; variants separated by "|"; default none),
# alternated ROUNDS times (default 2), so that a change is measured against the binary or
# the option before it on the same GPUs in one run. Writes ab.log into OUTPUT_DIR.
#   GPUS=2 VARIANTS="--overlap-after 0|--overlap-after 0.5" dev/gpu_ab.sh OUTPUT_DIR
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" "${1:-}"
log="$out/ab.log"
nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
for name in ${BINARIES:-scalestudy}; do
  echo "$name: $("$bundle/$name" --version)" | tee -a "$log"
done
IFS='|' read -r -a variants <<< "${VARIANTS:-}"
[ ${#variants[@]} -eq 0 ] && variants=("")
for round in $(seq "${ROUNDS:-2}"); do
  for name in ${BINARIES:-scalestudy}; do
    for variant in "${variants[@]}"; do
      # The first round also keeps the GEMM algorithms each run chose.
      keep="median step|exposed"
      [ "$round" = 1 ] && keep="median step|exposed|GEMM algorithms|^    (bias|gelu|dgelu)"
      $mpirun -np "${GPUS:-1}" "$bundle/$name" $timed_train $variant 2>&1 | grep -E "$keep" |
        sed "s/^/[$name${variant:+ $variant}] /" | tee -a "$log"
    done
  done
done
