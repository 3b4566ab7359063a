#!/usr/bin/env bash
# The scalestudy binary as a user meets it: help, a short run, and bad input that must
# end with exit code 2 and one line naming the option and the value.
set -uo pipefail
binary=$1
mpiexec=$2
source "$(dirname "$0")/cli_checks.sh"

expect_exit 0 "Usage: scalestudy train" "$binary" train --help
expect_exit 0 "--strategy" "$binary" train --help
expect_help_fits "$binary" train --help
expect_help_fits "$binary" bench --help
expect_exit 0 "Commands:" "$binary" --help
expect_exit 2 "Usage" "$binary"
expect_exit 0 "gpt2-small" "$binary" info
expect_exit 0 "124439808" "$binary" info
expect_exit 0 "summary: loss" "$binary" train --model tiny --steps 50

expect_exit 2 "no-such-option" "$binary" train --no-such-option 3
expect_exit 2 "unknown command 'trian'" "$binary" trian
expect_exit 2 "\-\-heads 5" "$binary" train --heads 5
expect_exit 2 "\-\-seq 100" "$binary" train --seq 100
expect_exit 2 "\-\-attention-kernel cudnn: needs \-\-backend cuda" "$binary" train --attention-kernel cudnn
expect_exit 2 "\-\-profile-kernels: needs \-\-backend cuda" "$binary" train --profile-kernels
expect_exit 2 "\-\-steps 0" "$binary" train --steps 0
expect_exit 2 "\-\-batch-per-rank -2" "$binary" train --batch-per-rank=-2
expect_exit 2 "steps" "$binary" train --steps ten
expect_exit 2 "\-\-config /nonexistent.ini" "$binary" train --config /nonexistent.ini
expect_exit 2 "\-\-token-file /nonexistent.bin" "$binary" train --data file --token-file /nonexistent.bin
expect_exit 2 "\-\-output /proc/no-such-folder/run.h5" "$binary" train --output /proc/no-such-folder/run.h5
expect_exit 2 "\-\-grad-reduce fp8" "$binary" train --grad-reduce fp8
expect_exit 2 "unrecognised option '--comm-engine'" "$binary" train --comm-engine copy
# A value that holds a newline or an escape is written as \xNN: the error stays one line.
expect_exit 2 "\-\-strategy ddp.x0arm -rf x: must be ddp or zero2" "$binary" train --strategy $'ddp\nrm -rf x'
lines=$("$binary" train --steps $'2\n3' 2>&1 | wc -l)
[ "$lines" = 1 ] || fail "a value with a newline gave $lines lines of error, not one"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'not a token file at all, just text\n%.0s' {1..10} >"$tmp/bad.bin"
# A bad token file is named as the option that gave it.
expect_exit 2 "\-\-token-file $tmp/bad.bin: " "$binary" train --data file --token-file "$tmp/bad.bin" --steps 2
printf 'model = tiny\nsteps = 3\nbogus_key = 1\n' >"$tmp/bad.ini"
expect_exit 2 "bogus_key" "$binary" train --config "$tmp/bad.ini"
printf 'model = tiny\nsteps = 3\nstrategy = zero2\n' >"$tmp/good.ini"
expect_exit 0 "strategy zero2" "$binary" train --config "$tmp/good.ini"

# Strong scaling that does not divide over the ranks: every rank refuses, exit 2.
expect_exit 2 "\-\-global-batch 8" "$mpiexec" --oversubscribe --allow-run-as-root -np 3 \
  "$binary" train --global-batch 8 --steps 2

# Gradients crossing 2 ranks in bf16 (zero2 with overlap: reduce-scatters in bf16).
expect_exit 0 "gradients reduced in bf16" "$mpiexec" --oversubscribe --allow-run-as-root -np 2 \
  "$binary" train --model tiny --steps 4 --grad-reduce bf16 --strategy zero2 --overlap on

# Ranks started with different options end the job with a message, not a hang.
expect_exit 2 "resolved seed (/config/seed in a result file) differently" timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root \
  -np 1 "$binary" train --steps 2 --seed 1 : -np 1 "$binary" train --steps 2 --seed 2
expect_exit 2 "configuration mismatch: rank 1 resolved bucket_mb" timeout 120 "$mpiexec" --oversubscribe \
  --allow-run-as-root -np 1 "$binary" train --steps 3 --bucket-mb 1 : -np 1 "$binary" train --steps 3 --bucket-mb 2

finish
