#!/usr/bin/env bash
# Runs the quickstart sweep through a real single-node Slurm cluster: installs and starts
# munge, slurmctld and slurmd from Debian's packages, submits the generated sbatch
# scripts (srun --mpi=pmix) and the report job, waits, and checks every result file is
# complete and the report and its plots exist. Needs root; otherwise it says so and skips.
#   tests/slurm/test_slurm_sweep.sh BINARY PYTHON
set -euo pipefail
binary=$(realpath "$1")
python=$2
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$SCALESTUDY_ROOT/tests/slurm/cluster.sh"

slurm_skip_unless_root "the Slurm test starts slurmctld, slurmd and munged"

echo "== Slurm: install and start a single-node cluster"
slurm_install_packages
SLURM_TEST_WORK=$(mktemp -d /tmp/scalestudy-slurm.XXXXXX)
node=$(hostname -s)
trap 'slurm_stop_single_node "$node" $?' EXIT
slurm_start_single_node "$node" "NodeName=$node CPUs=$(nproc) State=UNKNOWN"

echo "== submit the quickstart sweep through its generated scripts"
experiment="$SCALESTUDY_ROOT/experiments/quickstart.ini"
out="$SLURM_TEST_WORK/results"
"$python" "$SCALESTUDY_ROOT/jobscripts/sweep.py" "$experiment" --output-dir "$out" --launcher slurm --submit \
  --binary "$binary"
ls "$out/jobs"

echo "== wait for the jobs"
slurm_wait_for_jobs 1500

echo "== check the results"
failures=0
slurm_sweep_complete "$python" "$experiment" "$out" || failures=$((failures + 1))
# Two-rank points ran as two Slurm tasks on one node.
grep -q "2 rank(s) on 1 node(s)" "$out"/logs/quickstart-strong-ddp-overlap_off-n2-r0-*.out ||
  { echo "FAIL: the 2-rank job did not run 2 ranks"; failures=$((failures + 1)); }
[ -s "$out/report/report.md" ] || { echo "FAIL: no report"; failures=$((failures + 1)); }
for plot in strong_speedup strong_efficiency weak_efficiency tokens_per_s comm_fraction; do
  [ -s "$out/report/$plot.png" ] || { echo "FAIL: no $plot.png"; failures=$((failures + 1)); }
done
ls "$out/report" | head -30
echo "$((1 - (failures > 0))) passed, $((failures > 0)) failed"
[ "$failures" = 0 ]
