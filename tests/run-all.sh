#!/usr/bin/env bash
# Builds scalestudy and runs every test that this machine can run: the C++ unit, MPI and
# command-line tests through ctest (the GPU tests need a GPU and are skipped without one),
# the analysis package's and the sweep tool's tests through pytest, and (as root) the
# quickstart sweep submitted to a single-node Slurm cluster started for the purpose, and
# a sweep across the two nodes of a cluster of network namespaces (both torn down after).
set -euo pipefail
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SCALESTUDY_ROOT
source "$SCALESTUDY_ROOT/jobscripts/install-deps.sh"
install_system_packages "${SCALESTUDY_TEST_PACKAGES[@]}"

cd "$SCALESTUDY_ROOT"
jobs=$(nproc)
echo "== configure and build (CPU)"
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$jobs"

echo "== C++ tests"
ctest --preset cpu -j "$jobs" --timeout 900

# The analysis environment also holds cudnn-frontend's headers, which the CUDA
# configuration looks for.
setup_analysis_venv "$SCALESTUDY_ROOT/build/venv"

# Where the CUDA toolkit is installed the CUDA configuration is built too, so a CUDA
# compile error fails here; its GPU tests skip themselves without a GPU.
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ]; then
  echo "== configure and build (CUDA, $("$nvcc" --version | tail -1))"
  cmake --preset cuda -DCMAKE_CUDA_COMPILER="$nvcc" >/dev/null
  cmake --build --preset cuda -j "$jobs"
  ctest --preset cuda -L gpu --timeout 900
else
  echo "== CUDA build skipped: no nvcc on this machine"
fi

echo "== analysis and sweep-tool tests"
SCALESTUDY_BINARY="$SCALESTUDY_ROOT/build/cpu/scalestudy" \
  "$SCALESTUDY_ROOT/build/venv/bin/python" -m pytest -q "$SCALESTUDY_ROOT/analysis/tests" \
  "$SCALESTUDY_ROOT/tests/jobscripts" "$SCALESTUDY_ROOT/tests/peers" "$SCALESTUDY_ROOT/tests/slurm"

echo "== the quickstart sweep on a real single-node Slurm cluster"
bash "$SCALESTUDY_ROOT/tests/slurm/test_slurm_sweep.sh" "$SCALESTUDY_ROOT/build/cpu/scalestudy" \
  "$SCALESTUDY_ROOT/build/venv/bin/python"

echo "== a sweep across two nodes of a Slurm cluster in network namespaces"
bash "$SCALESTUDY_ROOT/tests/slurm/test_two_node_sweep.sh" "$SCALESTUDY_ROOT/build/cpu/scalestudy" \
  "$SCALESTUDY_ROOT/build/venv/bin/python"
