#!/usr/bin/env bash
# Faults injected into running jobs (invariants 4 and 5): SIGSTOP of a random rank with a
# short --comm-timeout, SIGTERM and SIGINT of a rank or of the launcher, and SIGKILL of a
# rank, across ddp and zero2, with and without overlap, at 2-4 ranks, each at a random
# step. Every job must end within the timeout plus 5 s, with a non-zero exit code and a
# message naming the cause, and leave a readable result file that holds its completed
# steps: renamed and marked failed with the reason, never complete; where the stopped or
# killed rank is rank 0, which writes the file, the .partial it leaves must still read.
# The target of each fault is found by process id, among the launcher's children. A SIGSTOP
# ends the job with one line from the ranks, whose roll call names the stopped rank, and only
# it, as the one that does not respond.
#   test_faults.sh BINARY MPIEXEC [STUCK_COLLECTIVE]; SIGSTOP_TRIALS=N (default 4)
set -uo pipefail
binary=$1
mpiexec=$2
work=$(mktemp -d)
cleanup() {
  pkill -KILL -P $$ 2>/dev/null
  for mount in "$work"/full "$work"/readonly; do mountpoint -q "$mount" && umount "$mount"; done
  rm -rf "$work"
}
trap cleanup EXIT
timeout_s=3
passed=0
failed=0
strategies=("ddp --overlap off" "ddp --overlap on" "zero2 --overlap off" "zero2 --overlap on")

fail() { echo "FAIL [$trial]: $*"; tail -5 "$log" | sed 's/^/    /'; failed=$((failed + 1)); }

# The process id of rank $2 among the launcher $1's children, from the rank its launcher
# gave it in its environment (Open MPI, PMIx or PMI).
pid_of_rank() {
  local pid
  for pid in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null |
       grep -Eqx "(OMPI_COMM_WORLD_RANK|PMIX_RANK|PMI_RANK)=$2"; then
      echo "$pid"; return
    fi
  done
}

# The ranks that a roll call found silent, from the one line that ended the job: "rank 3
# does not respond" or "ranks 1, 4-6 do not respond", listed one per line.
silent_ranks() {
  local list part
  list=$(sed -n 's/.* ranks\{0,1\} \([0-9, -]*\) do\(es\)\{0,1\} not respond.*/\1/p' "$1" | head -1)
  for part in ${list//,/ }; do seq "${part%-*}" "${part#*-}"; done
}

# The value of a root attribute of an HDF5 file, or "" when it cannot be read.
attribute() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): "\(.*\)"$/\1/p; s/^ *(0): \([0-9-]*\)$/\1/p'; }
steps_in() { h5dump -H -d /steps/loss "$1" 2>/dev/null | sed -n 's/.*DATASPACE  SIMPLE { ( \([0-9]*\) ).*/\1/p'; }

# run_trial NAME SIGNAL TARGET(rank index or "launcher") RANKS STRATEGY EXPECT_REASON
run_trial() {
  trial=$1
  local signal=$2 target=$3 ranks=$4 strategy=$5 reason=$6
  log="$work/$trial.log"
  local output="$work/$trial.h5"
  # shellcheck disable=SC2086
  "$mpiexec" --oversubscribe --allow-run-as-root --bind-to none -np "$ranks" "$binary" train --model tiny \
    --steps 1000000 --log-every 1 --flush-every 1 --strategy $strategy --comm-timeout "$timeout_s" \
    --output "$output" >"$log" 2>&1 &
  local launcher=$!
  local _
  for _ in $(seq 1 300); do
    grep -q "^step" "$log" && break
    sleep 0.1
  done
  # A random moment after the first step.
  sleep "0.$((RANDOM % 10))"
  local victim=$launcher rank_index=-1
  if [ "$target" != launcher ]; then
    rank_index=$target
    victim=$(pid_of_rank "$launcher" "$target")
  fi
  if [ -z "$victim" ] || ! grep -q "^step" "$log"; then
    fail "training never started"; kill -KILL "$launcher" 2>/dev/null; wait "$launcher" 2>/dev/null; return
  fi
  local started=$SECONDS
  kill -s "$signal" "$victim"
  # The job must end by itself; past the limit it is killed, and the trial fails.
  local limit=$((timeout_s + 5)) code=
  while kill -0 "$launcher" 2>/dev/null && [ $((SECONDS - started)) -le "$limit" ]; do sleep 0.2; done
  if kill -0 "$launcher" 2>/dev/null; then
    pkill -KILL -P "$launcher"; kill -KILL "$launcher"; wait "$launcher" 2>/dev/null
    fail "the job was still running $limit s after SIG$signal of $target"; return
  fi
  wait "$launcher"; code=$?
  local elapsed=$((SECONDS - started))
  [ "$code" != 0 ] || { fail "exit code 0 after SIG$signal"; return; }
  grep -Eq "$reason" "$log" || { fail "no message matches '$reason'"; return; }
  if [ "$signal" = STOP ]; then
    # One line says why the job ended, and its roll call names the stopped rank alone.
    local lines silent
    lines=$(grep -c "^scalestudy: rank" "$log")
    [ "$lines" = 1 ] || { fail "$lines lines from the ranks, not one"; return; }
    silent=$(silent_ranks "$log" | tr '\n' ' ')
    [ "$silent" = "$target " ] || { fail "the roll call names '${silent}' as silent, not rank $target"; return; }
  fi
  local file=$output
  if [ ! -e "$output" ]; then
    # Only a rank 0 that was stopped or killed may leave the .partial behind.
    if [ "$rank_index" = 0 ] && [ "$signal" != TERM ] && [ "$signal" != INT ]; then
      file="$output.partial"
    else
      fail "no renamed result file"; return
    fi
  fi
  local status steps
  status=$(attribute "$file" status)
  steps=$(steps_in "$file")
  [ -n "$steps" ] && [ "$steps" -ge 1 ] || { fail "$file holds no readable step"; return; }
  if [ "$file" = "$output" ]; then
    [ "$status" = failed ] || { fail "status '$status', not failed"; return; }
    [ -n "$(attribute "$file" failure_reason)" ] || { fail "no failure_reason"; return; }
  else
    [ "$status" != complete ] || { fail "a .partial marked complete"; return; }
  fi
  echo "ok [$trial] SIG$signal to $target, $ranks ranks, $strategy: exit $code after ${elapsed}s," \
    "$steps steps, ${status:-running}: $(attribute "$file" failure_reason | cut -c1-80)"
  passed=$((passed + 1))
}

stop_message="did not (finish|complete) within [0-9.]+ s"
term_message="terminated by SIG(TERM|INT)"
for i in $(seq 1 "${SIGSTOP_TRIALS:-4}"); do
  ranks=$((2 + RANDOM % 3))
  run_trial "stop$i" STOP $((RANDOM % ranks)) "$ranks" "${strategies[RANDOM % 4]}" "$stop_message"
done
run_trial term-launcher TERM launcher 3 "zero2 --overlap on" "$term_message"
run_trial term-rank TERM 1 2 "ddp --overlap on" "$term_message"
run_trial term-rank0 TERM 0 3 "ddp --overlap off" "$term_message"
run_trial int-launcher INT launcher 2 "zero2 --overlap off" "$term_message"
run_trial kill-rank KILL 2 3 "zero2 --overlap on" "killed|signal 9|exited on signal|did not finish"

# The output on a file system that fills up during the run, or that is read-only: the
# first fails with one line naming the file and the OS's error and keeps what was flushed;
# the second, and one too small from the start, are refused before the first step.
disk_trials() {
  mkdir -p "$work/full" "$work/readonly"
  if ! mount -t tmpfs -o size=1m tmpfs "$work/full" 2>/dev/null ||
     ! mount -t tmpfs -o ro,size=64k tmpfs "$work/readonly" 2>/dev/null; then
    echo "disk trials skipped: mounting a tmpfs needs root"; return
  fi
  trial=disk-small; log="$work/$trial.log"
  "$binary" train --steps 100000 --output "$work/full/run.h5" >"$log" 2>&1
  if [ $? = 2 ] && grep -q "KiB free" "$log"; then echo "ok [$trial] refused: $(tail -1 "$log")"; passed=$((passed + 1))
  else fail "a file system too small for the run was not refused"; fi
  trial=disk-readonly; log="$work/$trial.log"
  "$binary" train --steps 5 --output "$work/readonly/run.h5" >"$log" 2>&1
  if [ $? = 2 ] && grep -q "not writable" "$log"; then echo "ok [$trial] refused: $(tail -1 "$log")"; passed=$((passed + 1))
  else fail "a read-only output folder was not refused"; fi
  trial=disk-full; log="$work/$trial.log"
  "$binary" train --steps 300 --flush-every 1 --log-every 1 --output "$work/full/run.h5" >"$log" 2>&1 &
  local run=$! _
  for _ in $(seq 1 300); do grep -q "^step" "$log" && break; sleep 0.1; done
  dd if=/dev/zero of="$work/full/filler" bs=64k 2>/dev/null
  wait "$run"; local code=$?
  local file="$work/full/run.h5"
  [ -e "$file" ] || file="$file.partial"
  if [ "$code" = 0 ]; then fail "the run did not fail on a full disk"
  elif [ "$(grep -c "No space left on device" "$log")" -lt 1 ]; then fail "no message names the OS error"
  elif grep -q "HDF5-DIAG" "$log"; then fail "HDF5's error stack reached the user"
  elif [ -z "$(steps_in "$file")" ]; then fail "$file holds no readable step"
  else
    echo "ok [$trial] exit $code, $(steps_in "$file") steps kept, $(attribute "$file" status):" \
      "$(grep -m1 "No space left" "$log" | cut -c1-120)"
    passed=$((passed + 1))
  fi
}
disk_trials

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
