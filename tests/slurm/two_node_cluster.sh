# Sourced by the two-node Slurm tests: a Slurm cluster of two nodes built on this machine,
# torn down when the test ends, failed or not. Each node is a network namespace with a
# hostname of its own (a UTS namespace) and an address on a bridge, 10.77.0.0/24, that
# lives in a third namespace: nothing of the cluster has an address in the host's own
# namespace, so its traffic never leaves the namespaces the test creates. Each node runs
# its slurmd; the first also runs slurmctld, and one munged serves both. Open MPI runs
# between the nodes over TCP on the bridge's network only.
#
# two_node_cluster_start WHAT starts it (WHAT: what the test does, for the message that
# skips it without root or namespaces) and exports SLURM_TEST_WORK, SLURM_CONF and Open
# MPI's network settings; in_cluster then runs Slurm's client commands on the first node.
# The caller sets SCALESTUDY_ROOT.
source "$SCALESTUDY_ROOT/tests/slurm/cluster.sh"

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

# srun on the cluster, the job step ended as soon as one task fails, and started once more
# where it ended non-zero but not 2 (bad input): the sweep's own launches do the same for
# Open MPI's start-up race (stress_two_node_start.sh), about one start in 150.
srun_once_more() {
  local status=0
  in_cluster srun --kill-on-bad-exit=1 "$@" || status=$?
  if [ "$status" != 0 ] && [ "$status" != 2 ]; then
    echo "srun ended with $status: started once more"
    status=0
    in_cluster srun --kill-on-bad-exit=1 "$@" || status=$?
  fi
  return "$status"
}

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
  slurm_remove_work_unless_failed "$status"
  exit "$status"
}

two_node_cluster_start() {
  local what=$1
  slurm_skip_unless_root "$what creates network namespaces and starts slurmctld, slurmd and munged"
  # Names carry this shell's pid, so that two runs on one machine never share a namespace.
  tag="ss$$"
  probe="$tag-probe"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "SKIPPED: $what needs network namespaces, and 'ip netns add' is not permitted here"
    exit 0
  fi
  if ! ip netns exec "$probe" unshare --uts true 2>/dev/null; then
    ip netns del "$probe"
    echo "SKIPPED: $what needs UTS namespaces (a hostname per node), and 'unshare --uts' is not permitted here"
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
}
