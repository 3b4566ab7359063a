# Sourced by the Slurm tests: the parts of a throw-away Slurm cluster they share. munged
# with a socket of its own, a slurm.conf whose state, logs and pid files all lie in the
# test's scratch folder, waiting for the nodes and for the jobs, and checking that every
# point of a sweep completed.
#
# The caller sets SLURM_TEST_WORK (its scratch folder) before calling these, and may
# redefine in_cluster to run Slurm's client commands where the controller is reachable
# (the two-node test runs them inside a node's network namespace).

# Slurm's client commands run here unless the caller says otherwise.
in_cluster() { "$@"; }

# Ends the test, as skipped, unless it runs as root: the daemons of a cluster need it.
# Argument: what the test starts.
slurm_skip_unless_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "SKIPPED: $1 and needs root"
    exit 0
  fi
}

# Debian's slurm-wlm and munge, installed where missing.
slurm_install_packages() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
  fi
}

# munged with its own socket and pid file under SLURM_TEST_WORK; every daemon of the
# cluster reaches it by that path, whichever network namespace it runs in.
slurm_start_munge() {
  mkdir -p "$SLURM_TEST_WORK/munge" /etc/munge
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  chmod 400 /etc/munge/munge.key
  SLURM_MUNGE_SOCKET="$SLURM_TEST_WORK/munge/munge.socket"
  munged --force --key-file=/etc/munge/munge.key --socket="$SLURM_MUNGE_SOCKET" \
    --pid-file="$SLURM_TEST_WORK/munged.pid" --log-file="$SLURM_TEST_WORK/munged.log" \
    --seed-file="$SLURM_TEST_WORK/munge/seed"
}

# Writes SLURM_TEST_WORK/slurm.conf and exports SLURM_CONF. Arguments: the controller's
# host (its name, or name(address)), then the node lines (NodeName=...) and the
# partition's node list. Each slurmd's spool, temporary (TmpFS, where the PMIx plugin
# puts its steps' files), log and pid files carry the node's name (%n), so that several
# slurmd can share the configuration and the file system; slurm_make_node_dirs creates
# the folders.
slurm_write_conf() {
  local controller=$1 nodes=$2 partition_nodes=$3
  mkdir -p "$SLURM_TEST_WORK/spool/ctld" /etc/slurm
  cat >"$SLURM_TEST_WORK/slurm.conf" <<CONF
ClusterName=scalestudy-test
SlurmctldHost=$controller
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SLURM_MUNGE_SOCKET
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A batch job starts as soon as a node frees, not up to 3 s later (the default delay):
# the tests' points last a second or two each.
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
StateSaveLocation=$SLURM_TEST_WORK/spool/ctld
SlurmdSpoolDir=$SLURM_TEST_WORK/spool/d-%n
TmpFS=$SLURM_TEST_WORK/tmp-%n
SlurmctldPidFile=$SLURM_TEST_WORK/slurmctld.pid
SlurmdPidFile=$SLURM_TEST_WORK/slurmd-%n.pid
SlurmctldLogFile=$SLURM_TEST_WORK/slurmctld.log
SlurmdLogFile=$SLURM_TEST_WORK/slurmd-%n.log
SlurmctldPort=16817
SlurmdPort=16818
$nodes
PartitionName=test Nodes=$partition_nodes Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF="$SLURM_TEST_WORK/slurm.conf"
}

# The spool and temporary folders of the nodes named as arguments.
slurm_make_node_dirs() {
  for node in "$@"; do mkdir -p "$SLURM_TEST_WORK/spool/d-$node" "$SLURM_TEST_WORK/tmp-$node"; done
}

# Waits up to a minute until COUNT nodes are ready for jobs, then shows them.
slurm_wait_for_nodes() {
  local count=$1
  for _ in $(seq 1 60); do
    [ "$(in_cluster sinfo -h -N -o "%t" 2>/dev/null | grep -c -E "idle|mix|alloc")" -ge "$count" ] && break
    sleep 1
  done
  in_cluster sinfo -N
}

# Waits until the queue is empty; fails after SECONDS, showing the queue and the
# controller's log.
slurm_wait_for_jobs() {
  local deadline=$((SECONDS + $1))
  while [ -n "$(in_cluster squeue -h -o %i 2>/dev/null)" ]; do
    if [ $SECONDS -gt "$deadline" ]; then
      echo "FAIL: jobs still queued after $1 s"
      in_cluster squeue
      tail -30 "$SLURM_TEST_WORK/slurmctld.log"
      return 1
    fi
    sleep 2
  done
}

# Prints the sweep's plan with each point's status and says whether every point is
# complete; if not, shows the end of every job log. Arguments: the Python that runs the
# sweep tool, the experiment, the results folder.
slurm_sweep_complete() {
  local python=$1 experiment=$2 out=$3 plan points complete
  plan=$("$python" "$SCALESTUDY_ROOT/jobscripts/sweep.py" "$experiment" --output-dir "$out" --dry-run)
  echo "$plan"
  points=$(grep -c "\[" <<<"$plan" || true)
  complete=$(grep -c "\[complete\]" <<<"$plan" || true)
  if [ "$points" = 0 ] || [ "$points" != "$complete" ]; then
    echo "FAIL: $complete of $points points complete"
    for log in "$out"/logs/*.out; do echo "--- $log"; tail -5 "$log"; done
    return 1
  fi
}

# Ends the process named by a pid file, if it runs, and waits for it to go.
slurm_stop_pid_file() {
  local file=$1 pid
  [ -s "$file" ] || return 0
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# A cluster of one node, this host (NODE, its short name), for the single-node tests:
# munged, slurmctld and one slurmd, the node described by NODE_LINE, any further
# arguments appended to slurm.conf. slurm_stop_single_node ends it.
slurm_start_single_node() {
  local node=$1 node_line=$2 line
  shift 2
  slurm_start_munge
  slurm_make_node_dirs "$node"
  slurm_write_conf "$node" "$node_line" "$node"
  for line in "$@"; do echo "$line" >>"$SLURM_CONF"; done
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  slurm_wait_for_nodes 1
}

# Cancels every job, waits up to 30 s for the jobs to end (a job's slurmstepd outlives
# slurmd), then stops the daemons of slurm_start_single_node. The test's folder,
# SLURM_TEST_WORK, goes with them when the test passed; when it failed it stays, and the
# test says where, for the daemons' logs. Arguments: NODE and the test's exit status (an
# EXIT trap passes $?).
slurm_stop_single_node() {
  local node=$1 status=$2
  scancel --user=root >/dev/null 2>&1 || true
  for _ in $(seq 1 30); do
    [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
    sleep 1
  done
  slurm_stop_pid_file "$SLURM_TEST_WORK/slurmctld.pid"
  slurm_stop_pid_file "$SLURM_TEST_WORK/slurmd-$node.pid"
  slurm_stop_pid_file "$SLURM_TEST_WORK/munged.pid"
  slurm_remove_work_unless_failed "$status"
}

# Removes the test's folder, SLURM_TEST_WORK, after a test that passed (STATUS 0); after
# one that failed, keeps it and says where: the daemons' logs tell why. Argument: STATUS.
slurm_remove_work_unless_failed() {
  if [ "$1" = 0 ]; then
    rm -rf "$SLURM_TEST_WORK"
  else
    echo "the cluster's logs stay in $SLURM_TEST_WORK"
  fi
}
