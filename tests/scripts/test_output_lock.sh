#!/usr/bin/env bash
# One writer per output, and a complete mark that means complete (invariant 8), in parts,
# each a ctest test of its own (test_output_lock.<part>); with no PART, every part runs.
# - two_writers: a run on an output, and the same run started again on it while the first
#   writes, TWO_WRITER_TRIALS times (default 2; every second trial passes --overwrite to
#   the second run), then once with 2 ranks each. The second exits 2 naming the first's
#   pid and host, touching no file; the first exits 0 and its file reads back whole,
#   complete, with every step, and no lock file is left.
# - stale: a run SIGKILLed mid-way leaves its .partial and its lock file; the next run on
#   that output takes the lock, replaces the .partial and completes.
# - truncated: another program truncates a run's .partial while the run goes on (as a
#   second writer did before the lock): the run exits non-zero, and no file of that name
#   is called complete unless it reads back whole.
#   test_output_lock.sh BINARY MPIEXEC STUCK_COLLECTIVE [PART]
set -uo pipefail
binary=$1
mpiexec=$2
only_part=${4:-}
# shellcheck disable=SC2034  # run_parts (cli_checks.sh) reads it
parts=(two_writers stale truncated)
work=$(mktemp -d)
started_pids=()
cleanup() {
  local pid
  for pid in "${started_pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=cli_checks.sh
source "$(dirname "$0")/cli_checks.sh"
host=$(hostname)
steps=200

# The value of a root attribute of an HDF5 file, or "" when it cannot be read.
attribute() { h5dump -a "$2" "$1" 2>/dev/null | sed -n 's/^ *(0): "\(.*\)"$/\1/p'; }
steps_in() { h5dump -H -d /steps/step_index "$1" 2>/dev/null | sed -n 's/.*DATASPACE  SIMPLE { ( \([0-9]*\) ).*/\1/p'; }
# Every object and value of the file reads (h5dump reads all of it).
reads_whole() { h5dump "$1" >/dev/null 2>&1; }

# Waits up to 60 s for the file $1 to exist.
wait_for_file() {
  local _
  for _ in $(seq 1 600); do [ -e "$1" ] && return 0; sleep 0.1; done
  return 1
}

# check_complete NAME FILE: the file is complete, reads back whole and holds every step.
check_complete() {
  local name=$1 file=$2
  [ -e "$file" ] || { fail "[$name] no file $file"; return 1; }
  [ "$(attribute "$file" status)" = complete ] || { fail "[$name] status '$(attribute "$file" status)'"; return 1; }
  reads_whole "$file" || { fail "[$name] $file is marked complete and does not read back"; return 1; }
  [ "$(steps_in "$file")" = "$steps" ] || { fail "[$name] $(steps_in "$file") steps, not $steps"; return 1; }
  if [ -e "$file.partial" ] || [ -e "$file.lock" ]; then fail "[$name] a .partial or .lock is left"; return 1; fi
}

# two_writers_trial NAME RANKS SECOND_OPTIONS: the second run starts once the first has
# created its .partial, so that it meets a file being written.
two_writers_trial() {
  local name=$1 ranks=$2 second_options=$3 launch=()
  local output="$work/$name.h5" first_log="$work/$name.first.log" second_log="$work/$name.second.log"
  [ "$ranks" = 1 ] || launch=("$mpiexec" --oversubscribe --allow-run-as-root --bind-to none -np "$ranks")
  "${launch[@]}" "$binary" train --model tiny --steps "$steps" -o "$output" >"$first_log" 2>&1 &
  local first=$!
  started_pids+=("$first")
  wait_for_file "$output.partial" || { fail "[$name] the first run created no .partial"; wait "$first"; return; }
  # The holder is the first run's writing rank: the process itself, or a child of its launcher.
  local writers
  writers=" $first $(pgrep -d ' ' -P "$first") "
  # shellcheck disable=SC2086
  "${launch[@]}" "$binary" train --model tiny --steps "$steps" -o "$output" $second_options >"$second_log" 2>&1
  local second_code=$?
  wait "$first"
  local first_code=$?
  local holder
  holder=$(sed -n "s/.*is being written by another run (pid \([0-9]*\) on host $host, since .*/\1/p" "$second_log")
  if [ "$second_code" != 2 ]; then fail "[$name] the second run exited $second_code, not 2"; tail -3 "$second_log"
  elif [ -z "$holder" ]; then fail "[$name] the second run names no holder on $host"; tail -3 "$second_log"
  elif [[ "$writers" != *" $holder "* ]]; then fail "[$name] holder pid $holder is not the first run's ($writers)"
  elif [ "$(grep -c "is being written" "$second_log")" != 1 ]; then fail "[$name] the refusal is not one line"
  elif grep -q "replacing" "$second_log"; then fail "[$name] the second run touched the first's .partial"
  elif [ "$first_code" != 0 ]; then fail "[$name] the first run exited $first_code"; tail -3 "$first_log"
  elif check_complete "$name" "$output"; then
    echo "ok [$name] $ranks rank(s)${second_options:+, $second_options}:" \
      "$(grep -m1 "is being written" "$second_log" | cut -c1-160)"
  fi
}

two_writers() {
  local trial
  for trial in $(seq 1 "${TWO_WRITER_TRIALS:-2}"); do
    if [ $((trial % 2)) = 0 ]; then two_writers_trial "two-writers-$trial" 1 --overwrite
    else two_writers_trial "two-writers-$trial" 1 ""; fi
  done
  two_writers_trial two-writers-2-ranks 2 ""
}

stale() {
  local output="$work/stale.h5" log="$work/stale.log"
  "$binary" train --model tiny --steps 1000000 --log-every 1 -o "$output" >"$log" 2>&1 &
  local run=$! _
  started_pids+=("$run")
  for _ in $(seq 1 600); do grep -q "^step" "$log" && break; sleep 0.1; done
  kill -KILL "$run"
  wait "$run" 2>/dev/null
  if [ ! -e "$output.partial" ] || [ ! -e "$output.lock" ]; then
    fail "[stale] the killed run left no .partial or no lock file"; return
  fi
  "$binary" train --model tiny --steps "$steps" -o "$output" >"$log" 2>&1
  local code=$?
  if [ "$code" != 0 ]; then fail "[stale] the next run exited $code"; tail -3 "$log"
  elif ! grep -q "replacing $output.partial, left by a run that did not finish" "$log"; then
    fail "[stale] the next run did not say it replaced the .partial"
  elif check_complete stale "$output"; then
    echo "ok [stale] the lock file of a killed run is taken over, and the next run completes"
  fi
}

truncated() {
  local output="$work/truncated.h5" log="$work/truncated.log"
  "$binary" train --model tiny --steps 400 --log-every 1 --flush-every 1 -o "$output" >"$log" 2>&1 &
  local run=$! _
  started_pids+=("$run")
  for _ in $(seq 1 600); do grep -Eq "^step +50/" "$log" && break; sleep 0.05; done
  truncate -s 0 "$output.partial" || { fail "[truncated] no .partial to truncate"; wait "$run"; return; }
  wait "$run"
  local code=$?
  if [ "$code" = 0 ]; then fail "[truncated] the run exited 0 after its file was truncated"
  elif [ -e "$output" ] && [ "$(attribute "$output" status)" = complete ]; then
    fail "[truncated] the truncated file is marked complete"
  elif [ -e "$output" ] && [ "$(attribute "$output" status)" != failed ]; then
    fail "[truncated] $output is neither failed nor left as .partial"
  elif ! grep -q "is not complete: the file could not be marked complete: " "$log"; then
    fail "[truncated] no message says why the file is not complete"
  else
    echo "ok [truncated] exit $code: $(grep -m1 "is not complete" "$log" | cut -c1-140)"
  fi
}

run_parts "$only_part"
finish
