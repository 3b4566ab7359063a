#!/usr/bin/env bash
# One call on a GPU node: the sweep of an experiment file for the GPU counts the node has,
# with the local launcher (mpirun, as the Slurm scripts would run a point on one node).
# Usage: jobscripts/gpu_sweep.sh EXPERIMENT GPU_COUNTS, e.g.
#   jobscripts/gpu_sweep.sh experiments/gpt2-small-weak.ini 1..4
# Expects .gpu-bundle/ as jobscripts/gpu_check.sh does. The results go to a tarball under
# $OUT (a call brings back only a few files); draw the report from them afterwards:
# scalestudy-report FOLDER.
#
# A sweep longer than one call: the sweep stops after SWEEP_SECONDS (default 540) and the
# tarball holds what is complete. Carry that tarball into the next call and name it in
# RESUME_FROM: it is unpacked first, and the sweep runs only the missing points.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh" /tmp/scalestudy-gpu-sweep
python=python3
[ -x /opt/torch/.venv/bin/python3 ] && python=/opt/torch/.venv/bin/python3
experiment=$1
gpus=$2
name=$(basename "$experiment" .ini)
mkdir -p /tmp/sweep
if [ -n "${RESUME_FROM:-}" ]; then tar xzf "$RESUME_FROM" -C /tmp/sweep; fi
{ "$binary" --version; nvidia-smi -L; } | tee "$out/$name.log"
timeout "${SWEEP_SECONDS:-540}" $python jobscripts/sweep.py "$experiment" --binary "$binary" \
  --gpus "$gpus" --output-dir "/tmp/sweep/$name" --no-report 2>&1 | tee -a "$out/$name.log"
# A point cut off by the timeout leaves only its .partial file, which the next call reruns.
tar czf "$out/$name.tgz" -C /tmp/sweep "$name"
