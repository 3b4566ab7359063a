#!/usr/bin/env bash
# The scalestudy binary as a user meets it, in parts, each a ctest test of its own
# (test_cli.<part>); with no PART, every part runs.
# - commands: help, a short run, and bad input that must end with exit code 2 and one line
#   naming the option and the value.
# - check: `info --json` says what the build runs, and `train --check` refuses what a run
#   would refuse, cross-field errors on the ranks given included, making no file or folder.
# - memory_preflight: a run too large for the memory is refused before anything is
#   allocated, on every rank alike, with exit code 2 and one line naming the batch option,
#   the model, the bytes and what would fit; a run that fits records the estimate in its
#   result file; and an allocation that fails later ends the run naming what it allocated,
#   with the result file marked failed.
# - disk_bound: the disk preflight's bound on the result file, which the banner prints, is
#   at least the file's size once written, for each strategy, overlap, rank count and
#   gradient accumulation (29 buckets of the tiny model, as many collective records a
#   step as a large model's default buckets give).
# - options_once: every option is declared once in src/ (those train and bench share, in
#   config/option_groups.cpp), and an option both commands offer has one entry in both --help.
#   test_cli.sh BINARY MPIEXEC [STUCK_COLLECTIVE [PART]]
set -uo pipefail
binary=$1
mpiexec=$2
only_part=${4:-}
parts=(commands memory_preflight check disk_bound options_once)
source "$(dirname "$0")/cli_checks.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The value of a root attribute of an HDF5 file, a string or a number.
attribute() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): "\{0,1\}\([^"]*\)"\{0,1\}$/\1/p'; }

# Each option's --help entry on one line, whitespace collapsed, without its default, which
# a command may set (bench's --model is by backend): "--name arg help".
help_entries() {
  "$@" 2>&1 | awk '/^  -/ { if (entry != "") print entry; entry = "" } /^  -/, /^$/ { entry = entry " " $0 }
                   /^$/ { if (entry != "") print entry; entry = "" } END { if (entry != "") print entry }' |
    tr -s ' ' | sed -E 's/^ //; s/ $//; s/^-h \[ --help \]/--help/; s/^-o \[ --output \]/--output/; s/ \(=[^)]*\)//'
}

options_once() {
  local source twice shared
  source="$(cd "$(dirname "$0")/../.." && pwd)/src"
  # An option's declaration opens with ("name" or ("name,x" at the start of a line or
  # right after add_options().
  twice=$(grep -rhoE '(^[[:space:]]*|add_options\(\))\("[a-z][a-z0-9-]*(,[a-z])?"' "$source" --include='*.cpp' |
    sed -E 's/.*\("//; s/[",].*//' | sort | uniq -d)
  [ -z "$twice" ] || fail "options declared more than once in src/: $(echo $twice)"
  help_entries "$binary" train --help | sort > "$work/train_help"
  help_entries "$binary" bench --help | sort > "$work/bench_help"
  shared=$(cut -d' ' -f1 "$work/train_help" | sort | comm -12 - <(cut -d' ' -f1 "$work/bench_help" | sort))
  [ -n "$shared" ] || fail "train and bench share no option (the help's entries were not found)"
  for option in $shared; do
    cmp -s <(grep -- "^$option " "$work/train_help") <(grep -- "^$option " "$work/bench_help") ||
      fail "$option: train --help and bench --help differ: $(grep -h -- "^$option " "$work/train_help" "$work/bench_help")"
  done
}

commands() {
  expect_exit 0 "Usage: scalestudy train" "$binary" train --help
  expect_exit 0 "--strategy" "$binary" train --help
  expect_help_fits "$binary" train --help
  expect_help_fits "$binary" bench --help
  expect_exit 0 "Commands:" "$binary" --help
  expect_exit 0 "gemm-search" "$binary" --help
  expect_exit 0 "\-\-micro-batch" "$binary" gemm-search --help
  expect_help_fits "$binary" gemm-search --help
  # The search times cuBLAS's algorithms: no other backend, and no search without its file.
  expect_exit 2 "\-\-backend cpu: gemm-search chooses cuBLAS's algorithms" \
    "$binary" gemm-search --backend cpu --micro-batch 2 --gemm-algos-file "$work/choices.txt"
  expect_exit 2 "'\-\-micro-batch' is required" "$binary" gemm-search --gemm-algos-file "$work/choices.txt"
  # A build with the cuda backend checks the search's values before it touches a GPU.
  if "$binary" info --json | grep -q '"cuda": {'; then
    local search=("$binary" gemm-search --gemm-algos-file "$work/choices.txt")
    expect_exit 2 "\-\-micro-batch 0: must be at least 1" "${search[@]}" --micro-batch 0
    expect_exit 2 "\-\-precision fp32: must be bf16 or fp16" "${search[@]}" --micro-batch 2 --precision fp32
    expect_exit 2 "\-\-seq 2048: must be 1 to the preset's 1024" "${search[@]}" --micro-batch 2 --seq 2048
    expect_exit 2 "\-\-reserve -1: must not be negative" "${search[@]}" --micro-batch 2 --reserve -1
    expect_exit 2 "\-\-cool-down-s -1: must be 0 to 3600" "${search[@]}" --micro-batch 2 --cool-down-s -1
    expect_exit 2 "'\-\-gemm-algos-file' is required" "$binary" gemm-search --micro-batch 2
    expect_exit 2 "\-\-gemm-algos-file /proc/no-such-folder/c.txt: cannot open its lock file" \
      "$binary" gemm-search --micro-batch 2 --gemm-algos-file /proc/no-such-folder/c.txt
    [ ! -e "$work/choices.txt" ] || fail "a refused search made its choice file"
  fi
  expect_exit 2 "Usage" "$binary"
  expect_exit 0 "gpt2-small" "$binary" info
  expect_exit 0 "124439808" "$binary" info
  expect_exit 0 "summary: loss" "$binary" train --model tiny --steps 50
  # What info and a run print reads at a glance: tiny's FLOPs per token not rounded to 0,
  # no exposed share of communication on one rank, memory not to six decimals.
  tiny_flops=$("$binary" info | awk '$1 == "tiny" { print $NF }')
  awk -v flops="$tiny_flops" 'BEGIN { exit !(flops + 0 > 0) }' || fail "info prints tiny at '$tiny_flops' per token"
  output=$("$binary" train --model tiny --steps 5 2>&1)
  ! grep -q "exposed" <<<"$output" || fail "a 1-rank run prints: $(grep exposed <<<"$output")"
  long_memory=$(grep "memory per rank" <<<"$output" | grep -E "[0-9][.][0-9]{4}" | head -1)
  [ -z "$long_memory" ] || fail "memory printed to more digits than it has: $long_memory"

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

  printf 'not a token file at all, just text\n%.0s' {1..10} >"$work/bad.bin"
  # A bad token file is named as the option that gave it.
  expect_exit 2 "\-\-token-file $work/bad.bin: " "$binary" train --data file --token-file "$work/bad.bin" --steps 2
  # A token file too short for one sample (10 tokens, 65 needed) is refused before the
  # banner, and no result file is left.
  { printf 'SSTOKENS\x01\0\0\0\x02\0\0\0\x0a'; head -c $((15 + 2 * 10)) /dev/zero; } >"$work/short.bin"
  output=$("$binary" train --data file --token-file "$work/short.bin" --output "$work/short.h5" 2>&1); code=$?
  [ "$code" = 2 ] && grep -q "^scalestudy train: error: --token-file $work/short.bin: holds 10 tokens" <<<"$output" ||
    fail "a token file too short: exit code $code: $(tail -1 <<<"$output")"
  ! grep -q "^scalestudy train: model" <<<"$output" || fail "a token file too short was found after the banner"
  [ -z "$(ls "$work" | grep short.h5)" ] || fail "a token file too short left $(ls "$work" | grep short.h5)"
  printf 'model = tiny\nsteps = 3\nbogus_key = 1\n' >"$work/bad.ini"
  expect_exit 2 "bogus_key" "$binary" train --config "$work/bad.ini"
  printf 'model = tiny\nsteps = 3\nstrategy = zero2\n' >"$work/good.ini"
  expect_exit 0 "strategy zero2" "$binary" train --config "$work/good.ini"

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
}

memory_preflight() {
  # GPT-2 small with 100000 sequences in one micro-batch needs tens of TiB. The refusal comes
  # from the estimate, within seconds, not from an allocation.
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
}

check() {
  "$binary" info --json >"$work/info.json" || fail "info --json exited $?"
  python3 -c 'import json, sys
info = json.load(open(sys.argv[1]))
assert info["backends"]["cpu"]["precisions"] == ["fp32"], info["backends"]
small = [p for p in info["presets"] if p["name"] == "gpt2-small"][0]
assert small["parameters"] == 124439808 and small["train_flops_per_token"] > 0, small' "$work/info.json" ||
    fail "info --json is not the JSON expected"
  expect_exit 2 "unrecognised option '--yaml'" "$binary" info --yaml
  local folder="$work/not-made/yet"
  expect_exit 0 "valid on 2 rank(s)" "$binary" train --check --check-ranks 2 --global-batch 8 --output "$folder/run.h5"
  [ ! -e "$work/not-made" ] || fail "train --check made the output's folder"
  expect_exit 2 "\-\-global-batch 7: does not divide evenly over 2 ranks" \
    "$binary" train --check --check-ranks 2 --global-batch 7 --output "$folder/run.h5"
  expect_exit 0 "valid on 1 rank(s)" "$binary" train --check --check-ranks 1 --global-batch 7
  expect_exit 2 "\-\-grad-accum 3: must divide the batch per rank (4)" \
    "$binary" train --check --check-ranks 3 --batch-per-rank 4 --grad-accum 3
  expect_exit 2 "\-\-lr" "$binary" train --check --check-ranks 1 --lr '$(touch x)'
  expect_exit 2 "\-\-seed 5%" "$binary" train --check --check-ranks 1 --seed 5%
  expect_exit 2 "\-\-check-ranks 2: needs \-\-check" "$binary" train --check-ranks 2
  expect_exit 2 "\-\-check-ranks 0: \-\-check needs" "$binary" train --check
  touch "$work/exists.h5"
  expect_exit 2 "exists; pass \-\-overwrite" "$binary" train --check --check-ranks 1 --output "$work/exists.h5"
  [ ! -e "$work/x" ] || fail "a value ran as a command"
}

disk_bound() {
  local ranks strategy accum output bound_kib size
  for run in "1 ddp --overlap off" "4 ddp --overlap off" "1 ddp --overlap on" "4 ddp --overlap on" \
             "1 zero2 --overlap off" "4 zero2 --overlap off" "1 zero2 --overlap on" "4 zero2 --overlap on" \
             "3 zero2 --overlap on --grad-accum 2"; do
    ranks=${run%% *}; strategy=${run#* }
    output="$work/bound-${ranks}-${strategy// /}.h5"
    # shellcheck disable=SC2086
    bound_kib=$(timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root --bind-to none -np "$ranks" "$binary" train \
      --model tiny --steps 100 --bucket-mb 0.004 --log-every 1000 --strategy $strategy --output "$output" 2>&1 |
      sed -n 's/^  result file: at most \([0-9]*\) KiB.*/\1/p')
    size=$(stat -c %s "$output" 2>/dev/null)
    if [ -z "$bound_kib" ] || [ -z "$size" ]; then fail "$ranks ranks, $strategy: no bound printed or no file"
    elif [ "$size" -gt $((bound_kib * 1024)) ]; then fail "$ranks ranks, $strategy: $size bytes, above the bound of $bound_kib KiB"
    else echo "ok: $ranks ranks, $strategy: $((size / 1024)) KiB written, bound $bound_kib KiB"; fi
  done
}

[ -n "$only_part" ] && selected=("$only_part") || selected=("${parts[@]}")
for part in "${selected[@]}"; do
  [[ " ${parts[*]} " == *" $part "* ]] || { echo "FAIL: no part '$part' (parts: ${parts[*]})"; exit 2; }
  "$part"
done
finish
