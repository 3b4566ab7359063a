# Sourced by tests/run-all.sh: runs its stages and says what each cost. `stage NAME CMD...`
# prints "== NAME", runs CMD, and prints the stage's wall time and the CPU time (user and
# system) of the processes it waited for; stage_times_summary prints every finished stage
# and the total. The CPU time leaves out what daemons (slurmd and the job steps they
# start) spend, and it does not grow with the machine's load, where the wall time does.

stage_times=()
stage_times_started=$SECONDS

# Sets stage_cpu_s to the CPU seconds of this shell's waited-for children so far (the
# second line of bash's `times`, which must run in this shell, not in a subshell).
stage_read_children_cpu() {
  local file
  file=$(mktemp)
  times >"$file"
  stage_cpu_s=$(sed -n 2p "$file" | tr 'ms' '  ' | awk '{ printf "%.1f", $1 * 60 + $2 + $3 * 60 + $4 }')
  rm -f "$file"
}

stage() {
  local name=$1 started=$SECONDS cpu_before line
  shift
  echo "== $name"
  stage_read_children_cpu
  cpu_before=$stage_cpu_s
  "$@"
  stage_read_children_cpu
  line=$(awk -v wall=$((SECONDS - started)) -v before="$cpu_before" -v after="$stage_cpu_s" -v name="$name" \
    'BEGIN { printf "%6d s wall %7.0f s cpu   %s", wall, after - before, name }')
  echo "== done:$line"
  stage_times+=("$line")
}

stage_times_summary() {
  local status=$?
  echo "== stage times"
  printf '%s\n' "${stage_times[@]}"
  echo "$(printf '%6d' $((SECONDS - stage_times_started))) s wall in all (exit status $status)"
}
