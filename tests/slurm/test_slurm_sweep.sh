#!/usr/bin/env bash
# Runs the quickstart sweep through a real single-node Slurm cluster: installs and starts
# munge, slurmctld and slurmd from Debian's packages, submits the generated sbatch
# scripts (srun --mpi=pmix) and the report job, waits, and checks every result file is
# complete and the report and its plots exist. Needs root; otherwise it says so and skips.
#   tests/slurm/test_slurm_sweep.sh BINARY PYTHON
set -euo pipefail
binary=$(realpath "$1")
python=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "SKIPPED: the Slurm test starts slurmctld, slurmd and munged and needs root"
  exit 0
fi

echo "== Slurm: install and start a single-node cluster"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi
work=$(mktemp -d /tmp/scalestudy-slurm.XXXXXX)
cleanup() {
  scancel --user=root >/dev/null 2>&1 || true
  [ -f "$work/slurmctld.pid" ] && kill "$(cat "$work/slurmctld.pid")" 2>/dev/null || true
  [ -f "$work/slurmd.pid" ] && kill "$(cat "$work/slurmd.pid")" 2>/dev/null || true
  [ -f "$work/munged.pid" ] && kill "$(cat "$work/munged.pid")" 2>/dev/null || true
}
trap cleanup EXIT

# munge: a key and a daemon of our own, with its own socket.
mkdir -p "$work/munge" /etc/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
chmod 400 /etc/munge/munge.key
munge_socket="$work/munge/munge.socket"
munged --force --key-file=/etc/munge/munge.key --socket="$munge_socket" \
  --pid-file="$work/munged.pid" --log-file="$work/munged.log" --seed-file="$work/munge/seed"

node=$(hostname -s)
cpus=$(nproc)
mkdir -p "$work/spool/ctld" "$work/spool/d" /etc/slurm
cat >"$work/slurm.conf" <<CONF
ClusterName=scalestudy-test
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$work/spool/ctld
SlurmdSpoolDir=$work/spool/d
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 1 60); do
  sinfo -h -o "%t" 2>/dev/null | grep -q -E "idle|mix|alloc" && break
  sleep 1
done
sinfo

echo "== submit the quickstart sweep through its generated scripts"
out="$work/results"
sed -e "s|^output_dir = .*|output_dir = $out|" "$root/experiments/quickstart.ini" >"$work/quickstart.ini"
"$python" "$root/jobscripts/sweep.py" "$work/quickstart.ini" --launcher slurm --submit --binary "$binary"
ls "$out/jobs"

echo "== wait for the jobs"
deadline=$((SECONDS + 1500))
while [ -n "$(squeue -h -o %i 2>/dev/null)" ]; do
  if [ $SECONDS -gt $deadline ]; then
    echo "FAIL: jobs still queued after 25 minutes"; squeue; tail -30 "$work/slurmctld.log"; exit 1
  fi
  sleep 3
done

echo "== check the results"
failures=0
plan=$("$python" "$root/jobscripts/sweep.py" "$work/quickstart.ini" --dry-run)
echo "$plan"
points=$(grep -c "\[" <<<"$plan" || true)
complete=$(grep -c "\[complete\]" <<<"$plan" || true)
if [ "$points" = 0 ] || [ "$points" != "$complete" ]; then
  echo "FAIL: $complete of $points points complete"; failures=$((failures + 1))
  for log in "$out"/logs/*.out; do echo "--- $log"; tail -5 "$log"; done
fi
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
