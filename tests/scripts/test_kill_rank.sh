#!/usr/bin/env bash
# Invariant 5: a rank that dies mid-run ends the job with a message, within a time
# limit, instead of leaving its peers waiting in a collective forever.
set -uo pipefail
binary=$1
mpiexec=$2
log=$(mktemp)
trap 'rm -f "$log"' EXIT

timeout 180 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 "$binary" train --model tiny \
  --steps 100000 --log-every 1 --strategy ddp --overlap on --comm-timeout 30 >"$log" 2>&1 &
launcher=$!

# Wait until training is under way, then kill one rank (not rank 0) with SIGKILL.
for _ in $(seq 1 600); do
  grep -q "^step" "$log" && break
  sleep 0.1
done
grep -q "^step" "$log" || { echo "FAIL: training never started"; cat "$log"; exit 1; }
victim=$(pgrep -f "$binary train --model tiny --steps 100000" | sort -n | tail -1)
[ -n "$victim" ] || { echo "FAIL: no rank process found"; exit 1; }
started=$(date +%s)
kill -9 "$victim"

wait "$launcher"
code=$?
elapsed=$(( $(date +%s) - started ))
echo "job ended with exit code $code, ${elapsed}s after the kill"
if [ "$code" = 0 ] || [ "$code" = 124 ]; then
  echo "FAIL: the job did not end with an error after a rank was killed"; tail -20 "$log"; exit 1
fi
if ! grep -Eiq "killed|signal 9|exited on signal|did not finish" "$log"; then
  echo "FAIL: no message says what happened"; tail -20 "$log"; exit 1
fi
grep -Ei "killed|signal 9|exited on signal|did not finish" "$log" | head -3
echo "1 passed, 0 failed"
