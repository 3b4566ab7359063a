#!/usr/bin/env bash
# Faults of running jobs, in parts, each a ctest test of its own (test_faults.<part>); with
# no PART, every part runs.
# - injected (invariants 4 and 5): SIGSTOP of a random rank with a short --comm-timeout,
#   SIGTERM and SIGINT of a rank or of the launcher, and SIGKILL of a rank, across ddp and
#   zero2, with and without overlap, at 2-4 ranks, each at a random step. Every job must end
#   within the timeout plus 5 s, with a non-zero exit code and a message naming the cause,
#   and leave a readable result file that holds its completed steps: renamed and marked
#   failed with the reason, never complete; where the stopped or killed rank is rank 0,
#   which writes the file, the .partial it leaves must still read. The target of each fault
#   is found by process id, among the launcher's children. A SIGSTOP ends the job with one
#   line from the ranks, whose roll call names the stopped rank, and only it, as the one
#   that does not respond. Then the output on a file system that fills up during the run,
#   or that is read-only.
# - nonfinite_loss: a run whose loss turns inf or nan stops at that step (--nonfinite-loss
#   stop, the default): exit code 1, one message, and the result file marked failed with
#   the step, never complete. With --nonfinite-loss continue it trains on and completes.
# - comm_timeout (invariant 5 through the deadlines): a peer that never joins leaves the
#   others waiting, and the job ends once the timeout has passed, with a message naming
#   where it waited. The collective watchdog: a collective that the last rank of
#   STUCK_COLLECTIVE never joins; the message names the rank, the collective and its phase.
#   The start-up's deadline (control/control_wait.h): a blocking call with no
#   deadline of its own (as the node split and NCCL's init are); one line names the phase.
#   test_faults.sh BINARY MPIEXEC STUCK_COLLECTIVE [PART]; SIGSTOP_TRIALS=N (default 4)
set -uo pipefail
binary=$1
mpiexec=$2
stuck_collective=$3
only_part=${4:-}
parts=(injected nonfinite_loss comm_timeout)
work=$(mktemp -d)
cleanup() {
  pkill -KILL -P $$ 2>/dev/null
  for mount in "$work"/full "$work"/readonly; do mountpoint -q "$mount" && umount "$mount"; done
  rm -rf "$work"
}
trap cleanup EXIT
timeout_s=3         # --comm-timeout of the injected faults
stuck_timeout_s=2   # and of stuck_collective
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
#   [EXPECT_FILE_REASON: a pattern the result file's failure_reason must match]
run_trial() {
  trial=$1
  local signal=$2 target=$3 ranks=$4 strategy=$5 reason=$6 file_reason=${7:-}
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
    if [ -n "$file_reason" ] && ! attribute "$file" failure_reason | grep -Eq "$file_reason"; then
      fail "failure_reason '$(attribute "$file" failure_reason)' does not match '$file_reason'"; return
    fi
  else
    [ "$status" != complete ] || { fail "a .partial marked complete"; return; }
  fi
  echo "ok [$trial] SIG$signal to $target, $ranks ranks, $strategy: exit $code after ${elapsed}s," \
    "$steps steps, ${status:-running}: $(attribute "$file" failure_reason | cut -c1-80)"
  passed=$((passed + 1))
}

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

# The signal trials, then the disk trials.
injected() {
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
  # The launcher's SIGTERM to the other ranks follows the SIGKILL: the file names the rank
  # that ended, not the SIGTERM, or the roll call's silent rank.
  run_trial kill-rank KILL 2 3 "zero2 --overlap on" "killed|signal 9|exited on signal|did not finish" \
    "rank 2 \(pid [0-9]+ on this host\) had ended without a word|rank 2 does not respond"
  disk_trials
}

# A learning rate of 1e30 without clipping sends the weights, and the loss, to nan.
nonfinite_loss() {
  local diverging="train --steps 30 --lr 1e30 --grad-clip 0 --log-every 100" code
  trial=nonfinite-stop; log="$work/$trial.log"
  # shellcheck disable=SC2086
  "$binary" $diverging --output "$work/stop.h5" >"$log" 2>&1
  code=$?
  if [ "$code" != 1 ] || ! grep -q "the loss is nan at step" "$log"; then
    fail "exit code $code, or no message"
  elif [ "$(attribute "$work/stop.h5" status)" != failed ] ||
       [[ "$(attribute "$work/stop.h5" failure_reason)" != "the loss is nan at step"* ]]; then
    fail "the file is not marked failed with the step"
  else
    echo "ok [$trial] $(attribute "$work/stop.h5" failure_reason)"; passed=$((passed + 1))
  fi
  trial=nonfinite-continue; log="$work/$trial.log"
  # shellcheck disable=SC2086
  "$binary" $diverging --nonfinite-loss continue --output "$work/go.h5" >"$log" 2>&1
  code=$?
  if [ "$code" != 0 ] || [ "$(attribute "$work/go.h5" status)" != complete ]; then
    fail "--nonfinite-loss continue did not complete (exit code $code)"
  else
    echo "ok [$trial] --nonfinite-loss continue completes"; passed=$((passed + 1))
  fi
}

# Runs stuck_collective in `mode` on 3 ranks and checks that it ended with an error between
# the timeout and 8 s after it (rank 0 gives up first, the others a second later, then the
# launcher tears the job down), with a line matching `pattern`.
expect_stuck_timeout() {  # mode pattern
  local mode=$1 pattern=$2 started code elapsed
  trial=${mode:-collective}; log="$work/stuck-$trial.log"
  started=$(date +%s)
  # shellcheck disable=SC2086
  timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 "$stuck_collective" "$stuck_timeout_s" $mode \
    >"$log" 2>&1
  code=$?
  elapsed=$(( $(date +%s) - started ))
  echo "$trial: the job ended with exit code $code after ${elapsed}s"
  if [ "$code" = 0 ] || [ "$code" = 124 ]; then
    fail "the job did not end with an error"; return
  fi
  if [ "$elapsed" -lt "$stuck_timeout_s" ] || [ "$elapsed" -gt $((stuck_timeout_s + 8)) ]; then
    fail "the job did not end between ${stuck_timeout_s} and $((stuck_timeout_s + 8)) s"; return
  fi
  if ! grep -Eq "$pattern" "$log"; then
    fail "no message names where it waited"; return
  fi
  echo "ok [$trial] $(grep -E "$pattern" "$log" | head -1)"
  passed=$((passed + 1))
}

comm_timeout() {
  expect_stuck_timeout "" "collective timed out: collective allreduce #1 \(phase grad-comm, 4.0 KiB\) did not finish within $stuck_timeout_s s on rank [01] -- a peer may have died or be stuck"
  expect_stuck_timeout startup "rank 0 on .*: the test's start-up barrier did not complete within $stuck_timeout_s s \(--comm-timeout\): a peer"
}

[ -n "$only_part" ] && selected=("$only_part") || selected=("${parts[@]}")
for part in "${selected[@]}"; do
  [[ " ${parts[*]} " == *" $part "* ]] || { echo "FAIL: no part '$part' (parts: ${parts[*]})"; exit 2; }
  "$part"
done

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
