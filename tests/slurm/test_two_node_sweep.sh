#!/usr/bin/env bash
# Runs a sweep across two nodes of a real Slurm cluster built on this machine, and tears
# the cluster down when it ends, failed or not. Each node is a network namespace with a
# hostname of its own (a UTS namespace) and an address on a bridge, 10.77.0.0/24, that
# lives in a third namespace: nothing of the cluster has an address in the host's own
# namespace, so its traffic never leaves the namespaces this test creates. Each node runs
# its slurmd; the first also runs slurmctld, and one munged serves both. Open MPI runs
# between the nodes over TCP on the bridge's network only.
#
# The sweep (experiments/two-nodes-cpu.ini: 1, 2 and 4 ranks, two per node, ddp and
# zero2, overlap off and on) goes through sbatch and srun --mpi=pmix; then `bench comm`
# runs on 4 ranks, two per node, and check_two_node_results.py checks what both wrote. Needs root and network namespaces;
# otherwise it says so and skips.
#   tests/slurm/test_two_node_sweep.sh BINARY PYTHON
set -euo pipefail
binary=$(realpath "$1")
python=$2
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$SCALESTUDY_ROOT/tests/slurm/cluster.sh"

slurm_skip_unless_root "the two-node Slurm test creates network namespaces and starts slurmctld, slurmd and munged"
# Names carry this shell's pid, so that two runs on one machine never share a namespace.
tag="ss$$"
probe="$tag-probe"
if ! ip netns add "$probe" 2>/dev/null; then
  echo "SKIPPED: the two-node Slurm test needs network namespaces, and 'ip netns add' is not permitted here"
  exit 0
fi
if ! ip netns exec "$probe" unshare --uts true 2>/dev/null; then
  ip netns del "$probe"
  echo "SKIPPED: the two-node Slurm test needs UTS namespaces (a hostname per node), and 'unshare --uts' is not permitted here"
  exit 0
fi
ip netns del "$probe"

echo "== two-node Slurm cluster: namespaces, bridge, munged, slurmctld and two slurmd"
slurm_install_packages
SLURM_TEST_WORK=$(mktemp -d /tmp/scalestudy-two-node.XXXXXX)
switch="$tag-switch"
namespaces=("$tag-node0" "$tag-node1")
hosts=(ss-node0 ss-node1)
addresses=(10.77.0.10 10.77.0.11)
network=10.77.0.0/24
interface=ssnet0

# Runs a command in node I's namespaces: its network, and a UTS namespace named after it.
# nsenter enters the network namespace only ('ip netns exec' would also mount a /sys
# without the cgroup file systems that slurmd needs).
in_node() {
  local node=$1
  shift
  nsenter --net="/run/netns/${namespaces[$node]}" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "${hosts[$node]}" "$@"
}
# Slurm's clients run on the first node, where the controller listens.
in_cluster() { nsenter --net="/run/netns/${namespaces[0]}" "$@"; }

# ip netns keeps a file per namespace there.
namespace_exists() { [ -e "/run/netns/$1" ]; }

# Whatever runs in a namespace of this test was started by it (the daemons, and the job
# steps they started); it is ended before the namespace is removed.
end_namespace() {
  local namespace=$1 pids
  namespace_exists "$namespace" || return 0
  pids=$(ip netns pids "$namespace" 2>/dev/null || true)
  [ -n "$pids" ] && kill $pids 2>/dev/null || true
  for _ in $(seq 1 50); do
    [ -z "$(ip netns pids "$namespace" 2>/dev/null)" ] && break
    sleep 0.1
  done
  pids=$(ip netns pids "$namespace" 2>/dev/null || true)
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  ip netns del "$namespace"
}

cleanup() {
  local status=$?
  set +e
  namespace_exists "${namespaces[0]}" && in_cluster scancel --user=root >/dev/null 2>&1
  for host in "${hosts[@]}"; do slurm_stop_pid_file "$SLURM_TEST_WORK/slurmd-$host.pid"; done
  slurm_stop_pid_file "$SLURM_TEST_WORK/slurmctld.pid"
  for namespace in "${namespaces[@]}" "$switch"; do end_namespace "$namespace"; done
  slurm_stop_pid_file "$SLURM_TEST_WORK/munged.pid"
  # Nothing may outlive the test: its namespaces (and with them the bridge and the
  # links), and every daemon it started.
  local left
  left=$(ip netns list | grep "^$tag-" | cut -d' ' -f1 | tr '\n' ' ' || true)
  for file in "$SLURM_TEST_WORK"/*.pid; do
    [ -s "$file" ] && kill -0 "$(cat "$file")" 2>/dev/null && left+=" $(basename "$file" .pid) (pid $(cat "$file"))"
  done
  if [ -n "$left" ]; then
    echo "FAIL: the two-node test left behind: $left"
    status=1
  fi
  if [ "$status" = 0 ]; then
    rm -rf "$SLURM_TEST_WORK"
  else
    echo "the cluster's logs stay in $SLURM_TEST_WORK"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The switch: a bridge in a namespace of its own, with one port per node.
ip netns add "$switch"
ip -n "$switch" link add bridge0 type bridge
ip -n "$switch" link set bridge0 up
for node in 0 1; do
  ip netns add "${namespaces[$node]}"
  ip -n "$switch" link add "port$node" type veth peer name "$interface" netns "${namespaces[$node]}"
  ip -n "$switch" link set "port$node" master bridge0 up
  ip -n "${namespaces[$node]}" link set lo up
  ip -n "${namespaces[$node]}" addr add "${addresses[$node]}/24" dev "$interface"
  ip -n "${namespaces[$node]}" link set "$interface" up
done

slurm_start_munge
slurm_make_node_dirs "${hosts[@]}"
# The emulated nodes share the host's cores; config_overrides lets each declare two CPUs,
# one per rank, whatever the host has.
slurm_write_conf "${hosts[0]}(${addresses[0]})" "SlurmdParameters=config_overrides
NodeName=${hosts[0]} NodeAddr=${addresses[0]} CPUs=2 State=UNKNOWN
NodeName=${hosts[1]} NodeAddr=${addresses[1]} CPUs=2 State=UNKNOWN" "${hosts[0]},${hosts[1]}"
in_node 0 slurmctld -f "$SLURM_CONF"
for node in 0 1; do in_node "$node" slurmd -f "$SLURM_CONF" -N "${hosts[$node]}"; done
slurm_wait_for_nodes 2

# Open MPI's byte transfer (btl), its runtime's out-of-band channel (oob) and PMIx's
# connections use the bridge's network only; sbatch passes this environment to the jobs,
# and srun to every rank.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_tcp_if_include=$network OMPI_MCA_oob_tcp_if_include=$network
export PMIX_MCA_ptl_tcp_if_include=$network

echo "== submit the two-node sweep through its generated scripts"
experiment="$SCALESTUDY_ROOT/experiments/two-nodes-cpu.ini"
out="$SLURM_TEST_WORK/results"
in_cluster "$python" "$SCALESTUDY_ROOT/jobscripts/sweep.py" "$experiment" --output-dir "$out" \
  --launcher slurm --submit --binary "$binary"

echo "== wait for the jobs"
slurm_wait_for_jobs 600

echo "== bench comm on both nodes: the world, each node's ranks, one rank per node"
bench_comm="$SLURM_TEST_WORK/bench-comm.h5"
in_cluster srun --mpi=pmix --nodes=2 --ntasks-per-node=2 --time=5 "$binary" bench comm --max-bytes 64K \
  --warmup 1 --repeats 3 --min-sample-ms 0.2 --comm-timeout 60 -o "$bench_comm"

echo "== check the results"
slurm_sweep_complete "$python" "$experiment" "$out"
# What the second node's port on the bridge carried, both ways (read in the switch's
# namespace, whose /sys shows its links).
link_bytes=$(ip netns exec "$switch" sh -c 'echo $(( $(cat /sys/class/net/port1/statistics/rx_bytes) + $(cat /sys/class/net/port1/statistics/tx_bytes) ))')
"$python" "$SCALESTUDY_ROOT/tests/slurm/check_two_node_results.py" "$out" "${hosts[@]}" --link-bytes "$link_bytes" \
  --bench-comm "$bench_comm"

# By hand (SCALESTUDY_SHAPED_LINK=1): the scaling model across the shaped link.
if [ "${SCALESTUDY_SHAPED_LINK:-0}" = 1 ]; then
  source "$SCALESTUDY_ROOT/tests/slurm/shaped_link_predict.sh"
fi
