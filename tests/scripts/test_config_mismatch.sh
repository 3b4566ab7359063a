#!/usr/bin/env bash
# Ranks started with different options end the job at start-up with exit code 2, and the
# message names the rank and the option that differs.
set -uo pipefail
binary=$1
mpiexec=$2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 1 "$binary" train --steps 3 --bucket-mb 1 \
  : -np 1 "$binary" train --steps 3 --bucket-mb 2 >"$log" 2>&1
code=$?
echo "job ended with exit code $code"
[ "$code" = 2 ] || { echo "FAIL: exit code $code, not 2"; tail -5 "$log"; exit 1; }
grep -q "configuration mismatch: rank 1 resolved bucket_mb" "$log" ||
  { echo "FAIL: the message names no rank and option"; tail -5 "$log"; exit 1; }
grep "configuration mismatch" "$log" | head -1
echo "1 passed, 0 failed"
