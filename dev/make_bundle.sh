#!/usr/bin/env bash
# The cross-build bundle: a CUDA build made on a development machine, packed for a GPU
# node whose HDF5 and Boost.Program_options differ from (or lack) the ones it was built
# against. Copies the binary, the GPU test executables (the names of tests/gpu/*.cpp) and
# the HDF5 and Boost.Program_options libraries the binary loads (with HDF5's libsz and
# libaec) into BUNDLE_DIR. The scripts of dev/ put that folder first in LD_LIBRARY_PATH;
# MPI, NCCL, cuBLAS and the CUDA runtime then come from the node itself.
#   dev/make_bundle.sh [BUILD_DIR [BUNDLE_DIR]]     defaults: build/cuda, .gpu-bundle
# With STRIP=1 the executables lose their debug information (a tenth of their size).
# With PACK=1 the executables are packed into BUNDLE_DIR/executables.tar.xz (about a
# quarter of their size), which dev/gpu_env.sh unpacks on the node. Another binary to
# compare against (`dev/gpu.sh ab`'s BINARIES) is copied in by hand under a name of its own.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build/cuda}
bundle=${2:-.gpu-bundle}
[ -x "$build/scalestudy" ] || { echo "$0: no $build/scalestudy: build it first" >&2; exit 2; }
mkdir -p "$bundle"
rm -f "$bundle/executables.tar.xz" "$bundle/.unpacked"

executables=(scalestudy)
cp "$build/scalestudy" "$bundle/"
for source in "$root"/tests/gpu/test_*.cpp "$root"/tests/gpu/mpi_test_*.cpp; do
  [ -e "$source" ] || continue
  name=$(basename "$source" .cpp)
  found=$(find "$build" -name "$name" -type f -perm -u+x -print -quit)
  if [ -n "$found" ]; then
    cp "$found" "$bundle/"
    executables+=("$name")
  fi
done

# The libraries, under the names the loader asks for (ldd's left column).
ldd "$build/scalestudy" | awk '$1 ~ /^lib(hdf5|boost_program_options|sz|aec)/ && $3 ~ /^\// {print $1, $3}' |
  while read -r name path; do cp -L "$path" "$bundle/$name"; done

if [ "${STRIP:-0}" = 1 ]; then
  (cd "$bundle" && strip --strip-debug "${executables[@]}")
fi
if [ "${PACK:-0}" = 1 ]; then
  tar -cJf "$bundle/executables.tar.xz" -C "$bundle" "${executables[@]}"
  (cd "$bundle" && rm -f "${executables[@]}")
fi
echo "$bundle: ${executables[*]}; libraries: $(cd "$bundle" && ls lib* 2>/dev/null | tr '\n' ' ')"
