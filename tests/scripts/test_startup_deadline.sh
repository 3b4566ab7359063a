#!/usr/bin/env bash
# A peer that never reaches a start-up call with no deadline of its own (the node split,
# NCCL's init) leaves the others waiting in it; the start-up's deadline ends the job once
# the timeout has passed, with one line naming the phase.
set -uo pipefail
mpiexec=$2
stuck_collective=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT

timeout_s=2
started=$(date +%s)
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 "$stuck_collective" "$timeout_s" startup >"$log" 2>&1
code=$?
elapsed=$(( $(date +%s) - started ))
echo "job ended with exit code $code after ${elapsed}s"
if [ "$code" = 0 ] || [ "$code" = 124 ]; then
  echo "FAIL: the job did not end with an error"; tail -20 "$log"; exit 1
fi
# Rank 0 gives up at the timeout, the others a second later; the launcher then needs a few.
if [ "$elapsed" -lt "$timeout_s" ] || [ "$elapsed" -gt $((timeout_s + 8)) ]; then
  echo "FAIL: the job did not end between ${timeout_s} and $((timeout_s + 8)) s"; tail -20 "$log"; exit 1
fi
pattern="rank 0 on .*: the test's start-up barrier did not complete within $timeout_s s \(--comm-timeout\): a peer"
if ! grep -Eq "$pattern" "$log"; then
  echo "FAIL: no line names the phase and the timeout"; tail -20 "$log"; exit 1
fi
grep -E "$pattern" "$log" | head -1
echo "1 passed, 0 failed"
