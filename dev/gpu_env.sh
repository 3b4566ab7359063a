# shellcheck shell=bash
# Sourced by dev/gpu.sh, or by hand on a GPU node, from the repository root:
#   source "$(dirname "$0")/gpu_env.sh" OUTPUT_DIR
# The executables and the libraries the GPU node lacks are in the bundle folder, $BUNDLE
# or .gpu-bundle/ (dev/make_bundle.sh makes it), plain or packed in executables.tar.xz,
# which is unpacked in place once. Sets out (OUTPUT_DIR, created), bundle, binary, mpirun
# (NVLink multicast off and the bundle's libraries first on every rank, then PyTorch's
# cuDNN where python3 has it) and timed_train:
# the train options that time the GPT-2 small bf16 step at BATCH per GPU (default 32),
# 14 steps of which 4 warm-up, without progress lines.
if [ -z "${1:-}" ]; then
  echo "usage: $0 OUTPUT_DIR" >&2
  exit 2
fi
out=$1
mkdir -p "$out"
bundle=$(cd "${BUNDLE:-.gpu-bundle}" 2>/dev/null && pwd) || {
  echo "$0: no bundle folder ${BUNDLE:-.gpu-bundle} (see dev/README.md)" >&2
  exit 2
}
# Executables may travel compressed (they shrink about fourfold): unpacked in place once.
if [ -f "$bundle/executables.tar.xz" ] && [ ! -e "$bundle/.unpacked" ]; then
  tar -xJf "$bundle/executables.tar.xz" -C "$bundle" && touch "$bundle/.unpacked"
fi
binary="$bundle/scalestudy"
export LD_LIBRARY_PATH="$bundle:${LD_LIBRARY_PATH:-}" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
# --attention-kernel cudnn opens libcudnn at run time; a GPU node whose cuDNN is PyTorch's
# (the nvidia.cudnn package) has it in that package's lib/ folder.
cudnn_root=$(python3 -c "import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])" 2>/dev/null || true)
if [ -n "$cudnn_root" ] && [ -d "$cudnn_root/lib" ]; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cudnn_root/lib"
fi
mpirun="mpirun --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE"
[ "$(id -u)" = 0 ] && mpirun="$mpirun --allow-run-as-root"
timed_train="train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank ${BATCH:-32} --steps 14
             --warmup-steps 4 --log-every 1000"
