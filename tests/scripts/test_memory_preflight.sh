#!/usr/bin/env bash
# The memory preflight as a user meets it: a run too large for the memory is refused
# before anything is allocated, on every rank alike, with exit code 2 and one line naming
# the batch option, the model, the bytes and what would fit; a run that fits records the
# estimate in its result file; and an allocation that fails later ends the run naming
# what it allocated, with the result file marked failed.
set -uo pipefail
binary=$1
mpiexec=$2
source "$(dirname "$0")/cli_checks.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
attribute() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): "\{0,1\}\([^"]*\)"\{0,1\}$/\1/p'; }

# The issue's reproducer: GPT-2 small with 100000 sequences in one micro-batch needs tens of
# TiB. The refusal comes from the estimate, within seconds, not from an allocation.
for pattern in "^scalestudy train: error: --global-batch 100000: model gpt2-small needs [0-9.]* TiB per rank" \
               "it fits with --grad-accum [0-9]*, or with --recompute on --grad-accum [0-9]*"; do
  expect_exit 2 "$pattern" timeout 30 "$binary" train --model gpt2-small --global-batch 100000
done
expect_exit 2 "\-\-batch-per-rank 4096: model gpt2-xl needs" timeout 30 "$binary" train --model gpt2-xl --batch-per-rank 4096

# Every rank refuses alike, and the job prints the refusal once.
output=$(timeout 60 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 \
  "$binary" train --model gpt2-small --global-batch 100000 2>&1); code=$?
[ "$code" = 2 ] || fail "2 ranks: exit code $code, expected 2"
count=$(grep -c "error: --global-batch 100000: model gpt2-small" <<<"$output")
[ "$count" = 1 ] || fail "2 ranks: the refusal printed $count times"

# A run that fits says what it expects to hold and records it beside what it held.
expect_exit 0 "memory per rank: estimated [0-9.]* MiB" "$binary" train --model tiny --steps 2 \
  --output "$work/tiny.h5"
estimate=$(attribute "$work/tiny.h5" memory_estimate_bytes)
available=$(attribute "$work/tiny.h5" memory_available_bytes)
{ [ -n "$estimate" ] && [ "$estimate" -gt 0 ] && [ -n "$available" ] && [ "$available" -gt "$estimate" ]; } ||
  fail "the result file holds memory_estimate_bytes '$estimate', memory_available_bytes '$available'"

# An allocation that fails after the preflight (here: an address-space limit that the
# host's MemAvailable does not show) ends the run naming what it was allocating, and the
# result file is marked failed with that reason. 1.5 GB of address space holds the MPI
# runtime and the libraries, not the 2 GiB of activations of 4096 tiny sequences.
(ulimit -v 1500000; exec "$binary" train --model tiny --batch-per-rank 4096 --steps 2 --output "$work/oom.h5") \
  >"$work/oom.log" 2>&1
code=$?
[ "$code" = 1 ] || fail "out of memory later: exit code $code, expected 1"
grep -q "out of memory while allocating activations ([0-9.]* MiB, cpu backend; .*) before the first step" \
  "$work/oom.log" || { fail "out of memory later: no message naming the phase"; tail -3 "$work/oom.log"; }
[ "$(attribute "$work/oom.h5" status)" = failed ] || fail "out of memory later: the file is not marked failed"
[[ "$(attribute "$work/oom.h5" failure_reason)" == "rank 0: out of memory while allocating activations"* ]] ||
  fail "out of memory later: failure_reason '$(attribute "$work/oom.h5" failure_reason)'"

finish
