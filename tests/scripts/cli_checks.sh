# Sourced by the script tests (test_*.sh): a failure counter and the exit-code check they
# share, the check of a --help, and the running of a script's parts. Each test ends with
# `finish`, which prints the count and fails if it is not 0.
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

expect_exit() {  # expected-code grep-pattern command...
  local expected=$1 pattern=$2; shift 2
  local output code
  output=$("$@" 2>&1); code=$?
  if [ "$code" != "$expected" ]; then fail "'$*' exited $code, expected $expected"; echo "$output" | tail -5; return; fi
  if [ -n "$pattern" ] && ! grep -q -- "$pattern" <<<"$output"; then
    fail "'$*' output lacks '$pattern'"; echo "$output" | tail -5
  fi
}

expect_help_fits() {  # command...: each option's entry in the --help it prints is at most 3 lines of
                      # at most 100 columns, and the help cites no history (change numbers, notes, GPUs)
  local problems
  problems=$("$@" 2>&1 | awk '
    /^$/ || /^[^ ]/ { entry = "" }
    /^  -/ { entry = $1; lines = 0 }
    entry != "" && ++lines == 4 { print entry " takes more than 3 lines" }
    length > 100 { print "a line of " length " columns: " $0 }
    /[Cc]hange[s]? [0-9]|performance[-]notes|H[12]00/ { print "history: " $0 }')
  [ -z "$problems" ] || fail "'$*': $problems"
}

# Runs the part named $1, or every part of the array `parts` when $1 is empty; a name that is
# no part ends the script with exit code 2.
run_parts() {
  local part selected
  [ -n "$1" ] && selected=("$1") || selected=("${parts[@]}")
  for part in "${selected[@]}"; do
    [[ " ${parts[*]} " == *" $part "* ]] || { echo "FAIL: no part '$part' (parts: ${parts[*]})"; exit 2; }
    "$part"
  done
}

finish() {
  echo "$failures failed"
  [ "$failures" = 0 ]
}
