# Sourced by the script tests (test_*.sh): a failure counter and the exit-code check they
# share. Each test ends with `finish`, which prints the count and fails if it is not 0.
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

finish() {
  echo "$failures failed"
  [ "$failures" = 0 ]
}
