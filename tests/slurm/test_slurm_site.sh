#!/usr/bin/env bash
# What a production site asks of a sweep, on a real single-node Slurm cluster (the one of
# test_slurm_sweep.sh, cluster.sh's): two small experiments of the tiny model that the
# test writes.
#   site: an Lmod module (Debian's lmod, a module file written here) loaded through
#     [sweep] modules, three points in one job array throttled to one task at a time, and
#     the report job that runs after them. Checks that every job saw the module's
#     environment, that no two tasks ran at once, and that the report exists.
#   resume: points that complete, one whose job is cancelled while it runs, one whose job
#     hits its one-minute time limit, and points that fail on bad input at run time (their
#     token file is replaced after `train --check` passed). Checks that `sweep.py status`
#     names each, and that submitting again reruns exactly the cancelled and the timed-out
#     points.
# Needs root; otherwise it says so and skips. About two minutes, most of it the minute
# the timed-out point runs before Slurm ends it.
#   tests/slurm/test_slurm_site.sh BINARY PYTHON
set -euo pipefail
binary=$(realpath "$1")
python=$2
SCALESTUDY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$SCALESTUDY_ROOT/tests/slurm/cluster.sh"
sweep_py="$SCALESTUDY_ROOT/jobscripts/sweep.py"

slurm_skip_unless_root "the Slurm site test starts slurmctld, slurmd and munged"
# The test packages (jobscripts/install-deps.sh) install Lmod: without it the test fails.
[ -r /usr/share/lmod/lmod/init/bash ] || { echo "FAIL: Debian's lmod is not installed (jobscripts/install-deps.sh)"; exit 1; }

echo "== Slurm: install and start a single-node cluster"
slurm_install_packages
SLURM_TEST_WORK=$(mktemp -d /tmp/scalestudy-slurm-site.XXXXXX)
work=$SLURM_TEST_WORK
node=$(hostname -s)
trap 'slurm_stop_single_node "$node" $?' EXIT
# Four CPUs on two cores: the timed-out point holds one for its minute while the other
# jobs (two of them a two-rank point) run beside it; config_overrides keeps the node in
# service although it has fewer.
slurm_start_single_node "$node" "NodeName=$node CPUs=4 State=UNKNOWN" "SlurmdParameters=config_overrides"

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Waits until squeue no longer lists the job (ID, or ARRAYJOB_TASK); fails after SECONDS.
wait_job_over() {
  local deadline=$((SECONDS + $2))
  while [ -n "$(squeue -h -j "$1" -o %i 2>/dev/null)" ]; do
    [ $SECONDS -gt "$deadline" ] && { echo "job $1 still queued after $2 s"; squeue; return 1; }
    sleep 1
  done
}
# The job a point runs as, from the sweep's manifest. Arguments: results folder, label.
job_of() {
  "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["points"][sys.argv[2]]["job"])' \
    "$1/jobs/submitted.json" "$2"
}
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1; }

echo "== the site: an Lmod module whose srun records the job's environment"
# The module puts a stub directory first on PATH, whose srun records the module's
# variable and the start and end of the launch (nanoseconds), then runs Slurm's srun.
real_srun=$(command -v srun)
mkdir -p "$work/modulefiles/site-test" "$work/stub" "$work/launches"
cat >"$work/modulefiles/site-test/1.0.lua" <<LUA
prepend_path("PATH", "$work/stub")
setenv("SITE_TEST_MODULE", "site-test/1.0")
LUA
cat >"$work/stub/srun" <<STUB
#!/bin/bash
start=\$(date +%s%N)
status=0
$real_srun "\$@" || status=\$?
echo "\${SITE_TEST_MODULE:-unset} \$start \$(date +%s%N) \${SLURM_ARRAY_JOB_ID:-none}_\${SLURM_ARRAY_TASK_ID:-none}" \
  >"$work/launches/\$SLURM_JOB_ID"
exit "\$status"
STUB
chmod +x "$work/stub/srun"
# sbatch hands the submitting shell's environment to the job: MODULEPATH, and Lmod's
# exported `module` function. The test's shell does not load the module itself, so its
# PATH has no stub: only a job that loads it launches through the stub.
export MODULEPATH="$work/modulefiles"
source /usr/share/lmod/lmod/init/bash

site="$work/site.ini"
cat >"$site" <<INI
[sweep]
name = site
scaling = strong
gpus = 1
repeats = 3
backend = cpu
time_limit = 00:05:00
modules = site-test/1.0
array_throttle = 1

[train]
model = tiny
data = markov
seq = 32
global-batch = 8
steps = 30
warmup-steps = 2
INI
site_out="$work/site-results"

echo "== resume: a token file that goes bad after the check"
# Strong points take about a second; a weak point's step (2048 samples) about 1.3 s on two
# cores, so that one is caught running and one outlives its one-minute limit: 200 steps
# outlast the limit and the check that finds it (up to 30 s later) on a machine twice as
# fast. No signal before the limit: the job ends TIMEOUT, as Slurm ends it.
"$python" - "$work/tokens.bin" <<'PY'
import random, struct, sys
count = 20000
tokens = [random.randrange(60) for _ in range(count)]
with open(sys.argv[1], "wb") as out:
    out.write(b"SSTOKENS" + struct.pack("<IIQQ", 1, 2, count, 0) + struct.pack(f"<{count}H", *tokens))
PY
resume="$work/resume.ini"
cat >"$resume" <<INI
[sweep]
name = resume
scaling = strong, weak
gpus = 1, 2
gpus_per_node = 2
strategies = ddp, zero2
backend = cpu
time_limit = 1
signal_before_limit_s = 0
bench_comm = off

[train]
model = tiny
data = file
token-file = $work/tokens.bin
seq = 32
global-batch = 2
batch-per-rank = 2048
steps = 200
warmup-steps = 2
INI
resume_out="$work/resume-results"

echo "== submit both"
"$python" "$sweep_py" "$site" --output-dir "$site_out" --launcher slurm --submit --binary "$binary"
"$python" "$sweep_py" "$resume" --output-dir "$resume_out" --launcher slurm --submit --binary "$binary" --gpus 1

echo "== cancel weak-ddp-overlap_off-n1-r0 while it runs"
cancelled=$(job_of "$resume_out" weak-ddp-overlap_off-n1-r0)
timed_out=$(job_of "$resume_out" weak-zero2-overlap_off-n1-r0)
for _ in $(seq 1 60); do [ "$(job_state "$cancelled")" = RUNNING ] && break; sleep 0.5; done
[ "$(job_state "$cancelled")" = RUNNING ] || fail "job $cancelled never ran"
sleep 2
scancel "$cancelled"

echo "== the two-rank points: submitted with a good token file, run with a bad one"
# Once the point that is to time out has opened the file and begun its run.
for _ in $(seq 1 60); do [ -e "$resume_out/weak/zero2-overlap_off/n1-r0.h5.partial" ] && break; sleep 0.5; done
[ -e "$resume_out/weak/zero2-overlap_off/n1-r0.h5.partial" ] || fail "job $timed_out did not begin its run"
# The partition holds them while the token file is replaced by one that does not read
# (the running points keep the file they opened).
scontrol update PartitionName=test State=DOWN
"$python" "$sweep_py" "$resume" --output-dir "$resume_out" --launcher slurm --submit --binary "$binary" --gpus 2
cp "$work/tokens.bin" "$work/tokens.good"
echo "not a token file" >"$work/tokens.bad"
mv "$work/tokens.bad" "$work/tokens.bin"
scontrol update PartitionName=test State=UP
# Each fails on the token file within seconds of its start.
for label in strong-ddp strong-zero2 weak-ddp weak-zero2; do
  wait_job_over "$(job_of "$resume_out" "$label-overlap_off-n2-r0")" 60 || fail "$label n2 did not end"
done
mv "$work/tokens.good" "$work/tokens.bin"

echo "== wait for the site's points and report, and for the time limit"
# The site's three points take some 2 s each and its report some 10 s: 120 s is ample.
# Slurm ends the timed-out job at its one-minute limit, found by a check every 30 s, its
# step killed at most 30 s (KillWait) after the signal: 150 s from here.
site_report=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["report"])' \
  "$site_out/jobs/submitted.json")
wait_job_over "$site_report" 120 || fail "the site's report job did not end"
wait_job_over "$timed_out" 150 || fail "job $timed_out did not end"

echo "== check the site"
slurm_sweep_complete "$python" "$site" "$site_out" || failures=$((failures + 1))
grep -q -- "--array=0-2%1" "$site_out/jobs/array-n1x1.sbatch" || fail "the array script has no throttle of 1"
# 1. Every point's launch went through the module's srun, with the module's variable set.
ls "$work/launches"
cat "$work/launches"/* 2>/dev/null || true
[ "$(cat "$work/launches"/* 2>/dev/null | grep -c "^site-test/1.0 ")" = 3 ] ||
  fail "not every job of the site launched through its module's srun with SITE_TEST_MODULE set"
# 2. At most one task at a time. The cluster keeps no accounting (no AccountingStorageType),
# so sacct has no records: the tasks' own records of their launches are used, each
# launch's start and end in nanoseconds. Sorted by start, every launch starts after the one
# before it ended; each lasts about a second, so two tasks that ran at once (a throttle
# of 2 or none, with four CPUs free) would overlap.
cat "$work/launches"/* 2>/dev/null | sort -k2,2n | awk '
  NR > 1 && $2 < end { print "FAIL: launch " $4 " started before " last " ended"; bad = 1 }
  { end = $3; last = $4 }
  END { exit bad }' || fail "two tasks of the throttled array ran at once"
# 3. The report job ran after the points: report.md exists and is newer than every result.
report="$site_out/report/report.md"
if [ -s "$report" ]; then
  for result in "$site_out"/strong/*/*.h5; do
    [ "$report" -nt "$result" ] || fail "the report is older than $result"
  done
else
  fail "no report from the report job"
fi

echo "== check the resume sweep's status"
status=$("$python" "$sweep_py" status "$resume" --output-dir "$resume_out")
echo "$status"
expect() {  # label, then a pattern its status line must match
  grep -E "^  $1 " <<<"$status" | grep -q -E -- "$2" || fail "status of $1 does not match: $2"
}
expect strong-ddp-overlap_off-n1-r0 "complete .*resume: done$"
expect strong-zero2-overlap_off-n1-r0 "complete .*resume: done$"
expect weak-ddp-overlap_off-n1-r0 "\[job $cancelled CANCELLED.*resume: rerun \(job $cancelled ended CANCELLED"
expect weak-zero2-overlap_off-n1-r0 "\[job $timed_out TIMEOUT.*resume: rerun \(job $timed_out ended TIMEOUT"
for label in strong-ddp strong-zero2 weak-ddp weak-zero2; do
  expect "$label-overlap_off-n2-r0" "resume: not rerun \(bad input"
done

echo "== submit again: exactly the cancelled and the timed-out points run again"
mkdir -p "$work/before/jobs" && cp "$resume_out/jobs/submitted.json" "$work/before/jobs/"
again=$("$python" "$sweep_py" "$resume" --output-dir "$resume_out" --launcher slurm --submit --binary "$binary")
echo "$again"
grep -q "wrote 2 job script(s)" <<<"$again" || fail "the resubmission did not write exactly 2 job scripts"
for label in weak-ddp-overlap_off-n1-r0 weak-zero2-overlap_off-n1-r0; do
  grep -q "^$label: rerun:" <<<"$again" || fail "$label is not rerun"
  [ "$(job_of "$resume_out" "$label")" != "$(job_of "$work/before" "$label")" ] || fail "$label kept its old job"
done
for label in strong-ddp strong-zero2 weak-ddp weak-zero2; do
  grep -q "^$label-overlap_off-n2-r0: not rerun, bad input" <<<"$again" || fail "$label n2 is not held"
done
status=$("$python" "$sweep_py" status "$resume" --output-dir "$resume_out")
echo "$status"
expect weak-ddp-overlap_off-n1-r0 "resume: waiting$"
expect weak-zero2-overlap_off-n1-r0 "resume: waiting$"
# The reruns run: each new job's log shows a step within 30 s (a weak step takes about
# 1.3 s, the start a second or two).
for label in weak-ddp-overlap_off-n1-r0 weak-zero2-overlap_off-n1-r0; do
  log=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["points"][sys.argv[2]]["log"])' \
    "$resume_out/jobs/submitted.json" "$label")
  for _ in $(seq 1 60); do grep -q "^step " "$log" 2>/dev/null && break; sleep 0.5; done
  grep -q "^step " "$log" 2>/dev/null || fail "the rerun of $label shows no step in $log"
done

echo "$((1 - (failures > 0))) passed, $((failures > 0)) failed"
[ "$failures" = 0 ]
