#!/usr/bin/env bash
# The main job: builds scalestudy and runs a short training run on this machine's CPUs,
# data-parallel over 2 MPI ranks, and prints its summary.
set -euo pipefail
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SCALESTUDY_ROOT
source "$SCALESTUDY_ROOT/jobscripts/install-deps.sh"
install_system_packages

cd "$SCALESTUDY_ROOT"
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j "$(nproc)" --target scalestudy

echo "== scalestudy train: tiny model on a Markov source, 2 ranks, zero2 with overlap"
mpirun --oversubscribe --allow-run-as-root -np 2 build/cpu/scalestudy train \
  --model tiny --data markov --steps 200 --batch-per-rank 4 --lr 1e-2 --lr-warmup-steps 10 \
  --weight-decay 0 --strategy zero2 --overlap on --log-every 20
