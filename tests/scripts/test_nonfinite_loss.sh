#!/usr/bin/env bash
# A run whose loss turns inf or nan stops at that step (--nonfinite-loss stop, the
# default): exit code 1, one message, and the result file marked failed with the step,
# never complete. With --nonfinite-loss continue it trains on and completes.
set -uo pipefail
binary=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
reason() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): "\(.*\)"$/\1/p'; }
failed=0
# A learning rate of 1e30 without clipping sends the weights, and the loss, to nan.
diverging="train --steps 30 --lr 1e30 --grad-clip 0 --log-every 100"
"$binary" $diverging --output "$work/stop.h5" >"$work/stop.log" 2>&1
code=$?
if [ "$code" != 1 ] || ! grep -q "the loss is nan at step" "$work/stop.log"; then
  echo "FAIL: exit code $code, or no message"; tail -3 "$work/stop.log"; failed=1
elif [ "$(reason "$work/stop.h5" status)" != failed ] ||
     [[ "$(reason "$work/stop.h5" failure_reason)" != "the loss is nan at step"* ]]; then
  echo "FAIL: the file is not marked failed with the step"; failed=1
else
  echo "ok: $(reason "$work/stop.h5" failure_reason)"
fi
"$binary" $diverging --nonfinite-loss continue --output "$work/go.h5" >"$work/go.log" 2>&1
code=$?
if [ "$code" != 0 ] || [ "$(reason "$work/go.h5" status)" != complete ]; then
  echo "FAIL: --nonfinite-loss continue did not complete (exit code $code)"; tail -3 "$work/go.log"; failed=1
else
  echo "ok: --nonfinite-loss continue completes"
fi
[ "$failed" = 0 ] && echo "2 passed, 0 failed"
exit "$failed"
