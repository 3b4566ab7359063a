# Sourced by the GPU job scripts (gpu_*.sh), from the repository root: the binaries and
# the libraries the GPU image lacks are in .gpu-bundle/ (see README, "Running on a GPU
# node"), plain or in .gpu-bundle/executables.tar.xz, and every rank runs with NVLink
# multicast off. Sets bundle, binary, mpirun and
# out (from $OUT, or the default the script passes as $1), and creates out; and
# timed_train, the train options of the scripts that time the GPT-2 small bf16 step at
# BATCH per GPU (default 32): 14 steps, 4 of them warm-up, no progress lines.
out=${OUT:-$1}
mkdir -p "$out"
bundle=$(pwd)/.gpu-bundle
# Executables may travel compressed (they shrink about fourfold): unpacked in place once.
if [ -f "$bundle/executables.tar.xz" ] && [ ! -e "$bundle/.unpacked" ]; then
  tar -xJf "$bundle/executables.tar.xz" -C "$bundle" && touch "$bundle/.unpacked"
fi
binary="$bundle/scalestudy"
export LD_LIBRARY_PATH="$bundle:${LD_LIBRARY_PATH:-}" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mpirun="mpirun --allow-run-as-root --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
timed_train="train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank ${BATCH:-32} --steps 14
             --warmup-steps 4 --log-every 1000"
