#!/usr/bin/env bash
# Runs a sweep across two nodes of a real Slurm cluster built on this machine
# (tests/slurm/two_node_cluster.sh), torn down when the test ends, failed or not.
#
# The sweep (experiments/two-nodes-cpu.ini: 1, 2 and 4 ranks, two per node, ddp and
# zero2, overlap off and on) goes through sbatch and srun --mpi=pmix; then `bench comm`
# runs on 4 ranks, two per node, and the sweep's 4-rank job with ddp and overlap on starts
# three more times (tests/slurm/stress_two_node_start.sh starts it many times); then
# check_two_node_results.py checks what the sweep and bench comm wrote; last,
# shaped_link_predict.sh shapes the link between the nodes to two rates and checks
# scalestudy-predict's prediction across it. Needs root and network namespaces; otherwise
# it says so and skips.
#   tests/slurm/test_two_node_sweep.sh BINARY PYTHON
set -euo pipefail
binary=$(realpath "$1")
python=$2
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$SCALESTUDY_ROOT/tests/slurm/two_node_cluster.sh"

two_node_cluster_start "the two-node Slurm test"

echo "== submit the two-node sweep through its generated scripts"
experiment="$SCALESTUDY_ROOT/experiments/two-nodes-cpu.ini"
out="$SLURM_TEST_WORK/results"
in_cluster "$python" "$SCALESTUDY_ROOT/jobscripts/sweep.py" "$experiment" --output-dir "$out" \
  --launcher slurm --submit --binary "$binary"

echo "== wait for the jobs"
slurm_wait_for_jobs 600

echo "== bench comm on both nodes: the world, each node's ranks, one rank per node"
bench_comm="$SLURM_TEST_WORK/bench-comm.h5"
srun_once_more --mpi=pmix --nodes=2 --ntasks-per-node=2 --time=5 --chdir="$SLURM_TEST_WORK" "$binary" bench comm --max-bytes 64K \
  --warmup 1 --repeats 3 --min-sample-ms 0.2 --comm-timeout 60 -o "$bench_comm"

echo "== start the 4-rank job (ddp, overlap on) a few more times: a start-up crash fails here," \
  "but for Open MPI's own race inside MPI_Init (stress_two_node_start.sh), shown with its stack"
source "$SCALESTUDY_ROOT/tests/slurm/stress_two_node_start.sh"
STRESS_ALLOW_MPI_INIT_RACE=1 stress_two_node_starts "$binary" 3 "$SLURM_TEST_WORK/starts"

echo "== check the results"
slurm_sweep_complete "$python" "$experiment" "$out"
# What the second node's port on the bridge carried, both ways (read in the switch's
# namespace, whose /sys shows its links).
link_bytes=$(ip netns exec "$switch" sh -c 'echo $(( $(cat /sys/class/net/port1/statistics/rx_bytes) + $(cat /sys/class/net/port1/statistics/tx_bytes) ))')
"$python" "$SCALESTUDY_ROOT/tests/slurm/check_two_node_results.py" "$out" "${hosts[@]}" --link-bytes "$link_bytes" \
  --bench-comm "$bench_comm"

echo "== the scaling model's prediction across the link, shaped to two rates"
source "$SCALESTUDY_ROOT/tests/slurm/shaped_link_predict.sh"
