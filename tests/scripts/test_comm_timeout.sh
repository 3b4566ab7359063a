#!/usr/bin/env bash
# Invariant 5 through the collective watchdog: a peer that never joins a collective
# leaves the others waiting in it; the watchdog ends the job once the timeout has passed,
# with a message naming the rank, the collective and its phase.
set -uo pipefail
mpiexec=$2
stuck_collective=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT

timeout_s=2
started=$(date +%s)
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 "$stuck_collective" "$timeout_s" >"$log" 2>&1
code=$?
elapsed=$(( $(date +%s) - started ))
echo "job ended with exit code $code after ${elapsed}s"
if [ "$code" = 0 ] || [ "$code" = 124 ]; then
  echo "FAIL: the job did not end with an error"; tail -20 "$log"; exit 1
fi
if [ "$elapsed" -lt "$timeout_s" ]; then
  echo "FAIL: the job ended before the timeout had passed"; tail -20 "$log"; exit 1
fi
pattern="collective timed out: collective allreduce #1 \(phase grad-comm, 4.0 KiB\) did not finish within"
pattern+=" $timeout_s s on rank [01] -- a peer may have died or be stuck"
if ! grep -Eq "$pattern" "$log"; then
  echo "FAIL: no message names the rank, the collective and its phase"; tail -20 "$log"; exit 1
fi
grep -E "$pattern" "$log" | head -2
echo "1 passed, 0 failed"
