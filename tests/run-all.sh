#!/usr/bin/env bash
# Builds scalestudy and runs every test that this machine can run: the C++ unit and MPI
# tests through ctest under AddressSanitizer and UndefinedBehaviorSanitizer, the tests of
# scalestudy's own threads under ThreadSanitizer, the command-line tests and the layering
# probes on the plain build (the GPU tests need a GPU and are skipped without one), the
# analysis package's and the sweep tool's tests through pytest, and (as root) the
# quickstart sweep submitted to a single-node Slurm cluster started for the purpose, a
# site's modules, a throttled job array and the resume by the jobs' ends on such a
# cluster, and a sweep across the two nodes of a cluster of network namespaces with the
# scaling model's prediction across their link, shaped to two rates (each torn down after).
# Each stage's wall time and the CPU time of the processes it waited for are printed as it
# ends, and all of them at the end.
set -euo pipefail
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SCALESTUDY_ROOT
source "$SCALESTUDY_ROOT/jobscripts/install-deps.sh"
source "$SCALESTUDY_ROOT/tests/stage_times.sh"
install_system_packages "${SCALESTUDY_TEST_PACKAGES[@]}"

cd "$SCALESTUDY_ROOT"
jobs=$(nproc)
trap stage_times_summary EXIT

# The plain build makes what the command-line tests, the sweeps and the analysis tests
# start; the unit and MPI tests run in the sanitizer builds below instead.
build_cpu() {
  cmake --preset cpu >/dev/null
  cmake --build --preset cpu -j "$jobs" --target cli_tests
}
stage "configure and build (CPU, the binary and the command-line tests' programs)" build_cpu
stage "command-line tests and layering probes" ctest --preset cpu -L "^(cli|layers)$" -j "$jobs" --timeout 900

build_sanitized() {
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1" -j "$jobs"
}
stage "configure and build (CPU, AddressSanitizer and UBSan)" build_sanitized cpu-sanitize
stage "unit and MPI tests under AddressSanitizer and UBSan" ctest --preset cpu-sanitize -j "$jobs" --timeout 900
stage "configure and build (CPU, ThreadSanitizer)" build_sanitized cpu-tsan
# One test at a time: the roll call's 300 ms window holds for an instrumented responder
# only where no other test competes for the two cores.
stage "scalestudy's threads under ThreadSanitizer" ctest --preset cpu-tsan --timeout 900

# The analysis environment also holds cudnn-frontend's headers, which the CUDA
# configuration looks for.
stage "analysis environment" setup_analysis_venv "$SCALESTUDY_ROOT/build/venv"

# Where the CUDA toolkit is installed the CUDA configuration is built too, so a CUDA
# compile error fails here; its GPU tests skip themselves without a GPU.
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
# Without a GPU nothing of it runs here, so it compiles without host optimisation or debug
# information: a check that it compiles, at about half the time of the preset's flags.
build_and_test_cuda() {
  cmake --preset cuda -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -DNDEBUG" \
    -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O0 -DNDEBUG" -DSCALESTUDY_TEST_CXX_FLAGS=-O0 >/dev/null
  # Only what the GPU tests run: the unit and MPI tests run in the CPU configuration.
  cmake --build --preset cuda -j "$jobs" --target gpu_tests
  ctest --preset cuda -L gpu --timeout 900
}
if [ -n "$nvcc" ]; then
  stage "configure and build (CUDA, $("$nvcc" --version | tail -1))" build_and_test_cuda
else
  echo "== CUDA build skipped: no nvcc on this machine"
fi

stage "analysis and sweep-tool tests" env SCALESTUDY_BINARY="$SCALESTUDY_ROOT/build/cpu/scalestudy" \
  "$SCALESTUDY_ROOT/build/venv/bin/python" -m pytest -q -n "$jobs" "$SCALESTUDY_ROOT/analysis/tests" \
  "$SCALESTUDY_ROOT/tests/jobscripts" "$SCALESTUDY_ROOT/tests/peers" "$SCALESTUDY_ROOT/tests/slurm"

stage "the quickstart sweep on a real single-node Slurm cluster" \
  bash "$SCALESTUDY_ROOT/tests/slurm/test_slurm_sweep.sh" "$SCALESTUDY_ROOT/build/cpu/scalestudy" \
  "$SCALESTUDY_ROOT/build/venv/bin/python"

# A site's modules (Lmod), a throttled job array, the report job, and the resume by the
# jobs' ends (cancelled, timed out, bad input) on the single-node cluster.
stage "a site's modules, a throttled array and the resume on a single-node Slurm cluster" \
  bash "$SCALESTUDY_ROOT/tests/slurm/test_slurm_site.sh" "$SCALESTUDY_ROOT/build/cpu/scalestudy" \
  "$SCALESTUDY_ROOT/build/venv/bin/python"

stage "a sweep across two nodes of a Slurm cluster in network namespaces, and the prediction across its shaped link" \
  bash "$SCALESTUDY_ROOT/tests/slurm/test_two_node_sweep.sh" "$SCALESTUDY_ROOT/build/cpu/scalestudy" \
  "$SCALESTUDY_ROOT/build/venv/bin/python"
