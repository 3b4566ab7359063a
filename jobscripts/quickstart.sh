#!/usr/bin/env bash
# The main job: builds scalestudy, runs the quickstart study on this machine's CPUs
# (a tiny model, strong and weak scaling at 1 and 2 MPI ranks, ddp and zero2 with and
# without overlap), and writes the HDF5 results, the report and its plots.
set -euo pipefail
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SCALESTUDY_ROOT
source "$SCALESTUDY_ROOT/jobscripts/install-deps.sh"
install_system_packages

cd "$SCALESTUDY_ROOT"
echo "== build"
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target scalestudy
setup_analysis_venv "$SCALESTUDY_ROOT/build/venv"

echo "== the quickstart study (experiments/quickstart.ini)"
"$SCALESTUDY_ROOT/build/venv/bin/python" jobscripts/sweep.py experiments/quickstart.ini \
  --launcher local --binary build/cpu/scalestudy
echo
echo "Results: $SCALESTUDY_ROOT/results/quickstart"
echo "Report:  $SCALESTUDY_ROOT/results/quickstart/report/report.md"
