#!/usr/bin/env bash
# `scalestudy bench` as a user meets it on the CPU: every benchmark at tiny sizes writes a
# complete file that h5dump can open, points that would not fit are kept as oom, comm
# results are exact over 2 ranks, and bad options end with exit code 2 and a line naming
# the option and the value.
set -uo pipefail
binary=$1
mpiexec=$2
source "$(dirname "$0")/cli_checks.sh"

# The file opens, is complete, and holds the bench group; prints nothing on success.
# (h5dump's output is captured before grep reads it: grep -q leaving a pipe early would
# fail the pipeline under pipefail.)
expect_file() {  # file bench-name
  local file=$1 name=$2 header
  if [ ! -f "$file" ] || [ -e "$file.partial" ]; then fail "$file missing, or its .partial left behind"; return; fi
  header=$(h5dump -H "$file" 2>&1) || fail "h5dump cannot open $file"
  grep -q "GROUP \"$name\"" <<<"$header" && grep -q 'DATASET "time_median_s"' <<<"$header" ||
    fail "$file lacks /bench/$name/time_median_s"
  grep -q '"complete"' <<<"$(h5dump -a /status "$file")" || fail "$file is not marked complete"
  grep -q "\"$name\"" <<<"$(h5dump -a /bench "$file")" || fail "$file does not name bench $name"
}

dataset() { h5dump -d "$2" "$1" 2>&1; }  # file path

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
quick=(--warmup 1 --repeats 3 --min-sample-ms 0.2)

expect_exit 0 "Usage: scalestudy bench" "$binary" bench --help
expect_exit 0 "\-\-max-bytes" "$binary" bench comm --help
expect_exit 0 "bench" "$binary" --help

expect_exit 0 "not available on cpu" "$binary" bench gemm --sizes 16,32 --precisions fp32,tf32,fp16,bf16 \
  "${quick[@]}" -o "$tmp/gemm.h5"
expect_file "$tmp/gemm.h5" gemm
grep -q '"unavailable"' <<<"$(dataset "$tmp/gemm.h5" /bench/gemm/status)" || fail "gemm: tf32/fp16/bf16 not kept as unavailable"
# By default the cpu measures the one precision it has and names none it lacks.
output=$("$binary" bench gemm --sizes 16 "${quick[@]}" -o "$tmp/gemm-default.h5" 2>&1) || fail "bench gemm exited $?"
! grep -q "unavailable\|not available" <<<"$output" || fail "bench gemm's defaults on the cpu: $(grep -c "not available" <<<"$output") unavailable points"

expect_exit 0 "accumulate" "$binary" bench bandwidth --sizes 1K..4K "${quick[@]}" -o "$tmp/bandwidth.h5"
expect_file "$tmp/bandwidth.h5" bandwidth

expect_exit 0 "attention-core" "$binary" bench layer --batches 1,2 --seqs 8 \
  "${quick[@]}" -o "$tmp/layer.h5"
expect_file "$tmp/layer.h5" layer

expect_exit 0 "backend cpu fp32" "$binary" bench inference --batches 1,2 --seqs 8,16 "${quick[@]}" -o "$tmp/inference.h5"
expect_file "$tmp/inference.h5" inference
grep -q '"fp32"' <<<"$(h5dump -a /precision "$tmp/inference.h5")" || fail "inference: the file does not record fp32"
# The backend counts exactly what the prediction says: the same numbers in both columns.
[ "$(dataset "$tmp/inference.h5" /bench/inference/memory_bytes | sed -n '/DATA {/,/}/p' | grep -o '[0-9]\{4,\}')" = \
  "$(dataset "$tmp/inference.h5" /bench/inference/allocated_bytes | sed -n '/DATA {/,/}/p' | grep -o '[0-9]\{4,\}')" ] ||
  fail "inference: allocated bytes differ from the predicted ones"

# With 130 MiB allowed, 128 MiB of head-room leaves the small point room and not the
# large one: the large one is kept, marked oom.
expect_exit 0 "oom" "$binary" bench inference --batches 1,64 --seqs 16,64 --memory-limit 130M "${quick[@]}" \
  -o "$tmp/oom.h5"
expect_file "$tmp/oom.h5" inference
statuses=$(dataset "$tmp/oom.h5" /bench/inference/status)
grep -q '"ok"' <<<"$statuses" && grep -q '"oom"' <<<"$statuses" || fail "inference: expected ok and oom points"

# Two ranks over MPI: every point checked exactly, busbw factors of 2 ranks.
expect_exit 0 "busbw" timeout 300 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 \
  "$binary" bench comm --max-bytes 16K "${quick[@]}" -o "$tmp/comm.h5"
expect_file "$tmp/comm.h5" comm
# The values only, without h5dump's "(index):" labels.
wrong=$(dataset "$tmp/comm.h5" /bench/comm/wrong_elems | sed -n '/DATA {/,/}/p' | sed 's/([0-9]*)://g' |
  grep -o '[0-9]\+' | sort -u | tr '\n' ' ')
[ "$wrong" = "0 " ] || fail "comm: wrong elements or none checked: '$wrong'"
# One node of two ranks: the node's communicator is measured, the cross-node one is absent.
scopes=$(dataset "$tmp/comm.h5" /bench/comm/scope)
grep -q '"world"' <<<"$scopes" && grep -q '"intra_node"' <<<"$scopes" || fail "comm: no world and intra_node rows"
! grep -q '"inter_node"' <<<"$scopes" || fail "comm: inter_node rows on one node"
grep -q '"absent: one node"' <<<"$(h5dump -a /bench/comm/scope_inter_node "$tmp/comm.h5")" ||
  fail "comm: the cross-node scope is not recorded as absent"
grep -q "0.5" <<<"$(dataset "$tmp/comm.h5" /bench/comm/bus_factor)" || fail "comm: no (n-1)/n factor at 2 ranks"
grep -q "(0): 2" <<<"$(h5dump -a /world_size "$tmp/comm.h5")" || fail "comm: world_size is not 2"

expect_exit 2 "expected a benchmark" "$binary" bench
expect_exit 2 "unknown benchmark 'gemmm'" "$binary" bench gemmm
expect_exit 2 "\-\-sizes 0" "$binary" bench gemm --sizes 0
expect_exit 2 "\-\-sizes 12X" "$binary" bench bandwidth --sizes 12X
expect_exit 2 "\-\-batches does not apply to bench gemm" "$binary" bench gemm --batches 4
expect_exit 2 "\-\-precisions fp8" "$binary" bench gemm --precisions fp8
expect_exit 2 "\-\-max-bytes 1K" "$binary" bench comm --min-bytes 4K --max-bytes 1K
expect_exit 2 "unrecognised option '--comm-engine'" "$binary" bench comm --comm-engine copy
expect_exit 2 "\-\-scopes rack" "$binary" bench comm --scopes rack
expect_exit 2 "\-\-scopes does not apply to bench gemm" "$binary" bench gemm --scopes world
expect_exit 2 "unrecognised option '--comm-engine'" "$binary" bench gemm --comm-engine copy
expect_exit 2 "\-\-heads 5" "$binary" bench layer --heads 5
expect_exit 2 "\-\-precision bf16: the cpu backend computes in fp32 only" "$binary" bench inference --precision bf16
expect_exit 2 "\-\-link-emulation socket: needs \-\-backend cuda" "$binary" bench comm --link-emulation socket
expect_exit 2 "\-\-link-emulation does not apply to bench gemm" "$binary" bench gemm --link-emulation socket
expect_exit 2 "\-\-precision tf16: must be auto" "$binary" bench layer --precision tf16
expect_exit 2 "\-\-precision does not apply to bench gemm" "$binary" bench gemm --precision bf16
expect_exit 2 "\-\-attention-kernel cudnn: needs \-\-backend cuda" "$binary" bench inference --attention-kernel cudnn
expect_exit 2 "\-\-attention-kernel flashy: must be auto, flash or cudnn" "$binary" bench layer --attention-kernel flashy
expect_exit 2 "\-\-attention-kernel does not apply to bench gemm" "$binary" bench gemm --attention-kernel flash
expect_exit 2 "\-\-repeats 0" "$binary" bench inference --repeats 0
expect_exit 2 "\-\-warmup 0" "$binary" bench gemm --warmup 0
expect_exit 2 "\-\-profile-kernels: needs \-\-backend cuda" "$binary" bench gemm --profile-kernels
expect_exit 2 "\-\-model nosuch" "$binary" bench layer --model nosuch
expect_exit 2 "\-\-backend tpu" "$binary" bench gemm --backend tpu
expect_exit 2 "no-such-option" "$binary" bench bandwidth --no-such-option 1
# Values that stand for a default, or that never end a sample, are refused when given.
expect_exit 2 "\-\-min-sample-ms inf: must be a finite number" "$binary" bench gemm --min-sample-ms inf
expect_exit 2 "\-\-comm-timeout inf: must be 1 to 1e6 s" "$binary" bench comm --comm-timeout inf
expect_exit 2 "\-\-comm-timeout 0.002: must be 1 to 1e6 s" "$binary" bench comm --comm-timeout 0.002
expect_exit 2 "\-\-sizes '': is empty" "$binary" bench gemm --sizes ""
expect_exit 2 "\-\-hidden 0: must be at least 1" "$binary" bench layer --hidden 0
expect_exit 2 "\-\-layers 0: must be at least 1" "$binary" bench inference --layers 0
expect_exit 2 "\-\-min-bytes 2M: is above the largest payload, 1M" "$binary" bench comm --min-bytes 2M
# The output is checked before anything runs, as train's is.
expect_exit 2 "\-\-output $tmp: is a directory" "$binary" bench gemm --sizes 16 -o "$tmp"
expect_exit 2 "\-\-output '': is empty" "$binary" bench gemm --sizes 16 -o ""
expect_exit 2 "\-\-output /proc/no-such-folder/gemm.h5" "$binary" bench gemm --sizes 16 -o /proc/no-such-folder/gemm.h5
expect_exit 2 "\-\-output $tmp/gemm.h5: exists; pass \-\-overwrite" "$binary" bench gemm --sizes 16 -o "$tmp/gemm.h5"
expect_exit 0 "results: $tmp/gemm.h5" "$binary" bench gemm --sizes 16 "${quick[@]}" -o "$tmp/gemm.h5" --overwrite
expect_file "$tmp/gemm.h5" gemm
expect_exit 2 "runs on one rank" timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 2 \
  "$binary" bench gemm --sizes 16

finish
