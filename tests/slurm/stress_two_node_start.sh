#!/usr/bin/env bash
# Starts the 4-rank job of the two-node sweep (experiments/two-nodes-cpu.ini's point with
# ddp and overlap on: two ranks per node, Open MPI over TCP between the nodes) STARTS times
# on the two-node cluster of tests/slurm/two_node_cluster.sh, and counts the starts that
# fail. Every rank that dumps core leaves its core file in that start's folder, and the
# faulting thread's stack (gdb) is printed; a failed start's log is printed too. Ends 0
# only where every start completed.
#   tests/slurm/stress_two_node_start.sh BINARY [STARTS]    (200 by default)
# The one crash these starts have shown lies in Open MPI 4.1: a rank still inside
# MPI_Init's exchange of connection data gets a peer's first message before its PML has
# registered the handler, and calls through NULL (a segfault at address 0 under
# ompi_mpi_init). With STRESS_ALLOW_MPI_INIT_RACE=1 a start whose every core file's stack
# runs through ompi_mpi_init is counted and shown but does not fail the run; any other
# failure does.
# With STRESS_LOCAL_PORTS="FIRST LAST", each node's ephemeral ports are narrowed to that
# range (net.ipv4.ip_local_port_range, in the node's own namespace), so that connect()
# runs out of local ports and fails with "Resource temporarily unavailable" as it can on a
# busy node: the start-up then meets that error on purpose.
# test_two_node_sweep.sh sources it and runs a few starts (stress_two_node_starts) on the
# cluster it has already started.
set -euo pipefail

# The command line of that point, as sweep.py writes it (the tiny model, a few steps).
stress_train_args=(train --model tiny --layers 2 --data markov --seq 32 --global-batch 8 --steps 6
                   --warmup-steps 1 --bucket-mb 0.02 --lr 0.003 --log-every 6
                   --strategy ddp --overlap on --backend cpu --comm-timeout 60)

# Prints the faulting thread's stack of each core file in DIR, read with BINARY.
stress_print_cores() {
  local binary=$1 dir=$2 core
  for core in "$dir"/core*; do
    [ -e "$core" ] || continue
    echo "--- $core"
    gdb -batch -q -ex "bt 30" "$binary" "$core" 2>&1 |
      grep -v "^\[New LWP\|^warning:\|^$" || true
  done
}

# Runs STARTS starts of the job with BINARY in folders under WORK; prints a line per
# failed start and a summary. Returns non-zero where any start failed.
stress_two_node_starts() {
  local binary=$1 starts=$2 work=$3 start dir status failed=0 crashed=0 in_mpi_init=0 began=$SECONDS
  command -v gdb >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gdb >/dev/null
  # srun passes the limit on to every rank (PropagateResourceLimits); the kernel's
  # core_pattern here is the relative "core", so each rank's core file lands in its
  # working directory, the start's folder.
  ulimit -c unlimited
  for start in $(seq 1 "$starts"); do
    dir="$work/start-$start"
    mkdir -p "$dir"
    status=0
    in_cluster srun --mpi=pmix --nodes=2 --ntasks-per-node=2 --time=5 --chdir="$dir" \
      "$binary" "${stress_train_args[@]}" -o "$dir/run.h5" >"$dir/log" 2>&1 || status=$?
    if [ "$status" != 0 ] || compgen -G "$dir/core*" >/dev/null; then
      failed=$((failed + 1))
      compgen -G "$dir/core*" >/dev/null && crashed=$((crashed + 1))
      echo "== start $start of $starts failed (exit status $status); its log:"
      tail -40 "$dir/log"
      stress_print_cores "$binary" "$dir" | tee "$dir/stacks"
      if compgen -G "$dir/core*" >/dev/null &&
         [ "$(grep -c '^--- ' "$dir/stacks")" = "$(awk '/^--- /{core=1} core && /ompi_mpi_init/{n++; core=0} END{print n+0}' "$dir/stacks")" ]; then
        in_mpi_init=$((in_mpi_init + 1))
      fi
    else
      rm -rf "$dir"
    fi
  done
  echo "== $starts starts of the 4-rank two-node job in $((SECONDS - began)) s: $failed failed, $crashed of them" \
    "with a core file, $in_mpi_init of those inside Open MPI's MPI_Init"
  if [ "${STRESS_ALLOW_MPI_INIT_RACE:-0}" = 1 ]; then
    [ "$failed" = "$in_mpi_init" ]
  else
    [ "$failed" = 0 ]
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  binary=$(realpath "$1")
  starts=${2:-200}
  SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  source "$SCALESTUDY_ROOT/tests/slurm/two_node_cluster.sh"
  two_node_cluster_start "the two-node start-up stress test"
  if [ -n "${STRESS_LOCAL_PORTS:-}" ]; then
    for namespace in "${namespaces[@]}"; do
      ip netns exec "$namespace" sysctl -q -w net.ipv4.ip_local_port_range="$STRESS_LOCAL_PORTS"
    done
  fi
  stress_two_node_starts "$binary" "$starts" "$SLURM_TEST_WORK/starts"
fi
