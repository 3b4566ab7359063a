#!/usr/bin/env bash
# Invariant 5 through the deadlines: a peer that never joins leaves the others waiting,
# and the job ends once the timeout has passed, with a message naming where it waited.
# - The collective watchdog: a collective that the last rank never joins; the message
#   names the rank, the collective and its phase.
# - The start-up's deadline (core/control_wait.h): a blocking call with no
#   deadline of its own (as the node split and NCCL's init are); one line names the phase.
set -uo pipefail
mpiexec=$2
stuck_collective=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout_s=2
failed=0

# Runs stuck_collective in `mode` on 3 ranks and checks that it ended with an error
# between the timeout and 8 s after it (rank 0 gives up first, the others a second later,
# then the launcher tears the job down), with a line matching `pattern`.
expect_timeout() {  # mode pattern
  local mode=$1 pattern=$2 started code elapsed
  started=$(date +%s)
  timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 "$stuck_collective" "$timeout_s" $mode >"$log" 2>&1
  code=$?
  elapsed=$(( $(date +%s) - started ))
  echo "${mode:-collective}: the job ended with exit code $code after ${elapsed}s"
  if [ "$code" = 0 ] || [ "$code" = 124 ]; then
    echo "FAIL: the job did not end with an error"; tail -20 "$log"; failed=$((failed + 1)); return
  fi
  if [ "$elapsed" -lt "$timeout_s" ] || [ "$elapsed" -gt $((timeout_s + 8)) ]; then
    echo "FAIL: the job did not end between ${timeout_s} and $((timeout_s + 8)) s"; tail -20 "$log"
    failed=$((failed + 1)); return
  fi
  if ! grep -Eq "$pattern" "$log"; then
    echo "FAIL: no message names where it waited"; tail -20 "$log"; failed=$((failed + 1)); return
  fi
  grep -E "$pattern" "$log" | head -1
}

expect_timeout "" "collective timed out: collective allreduce #1 \(phase grad-comm, 4.0 KiB\) did not finish within $timeout_s s on rank [01] -- a peer may have died or be stuck"
expect_timeout startup "rank 0 on .*: the test's start-up barrier did not complete within $timeout_s s \(--comm-timeout\): a peer"
echo "$((2 - failed)) passed, $failed failed"
[ "$failed" = 0 ]
