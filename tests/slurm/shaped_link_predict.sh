# The scaling model's accuracy across a node boundary, by hand: sourced by
# test_two_node_sweep.sh once its cluster runs, when SCALESTUDY_SHAPED_LINK=1 (it takes
# about three minutes on two shared cores, past what CI can spend on it). For each of two
# link rates, the link between the two nodes is shaped with tc (netem: a rate and a delay;
# tbf, the rate alone, where the kernel lacks netem) on each node's side of the veth pair,
# so both directions; a ddp sweep of 1, 2 and 4 ranks (two per node) and a bench comm on
# both nodes run on it, and scalestudy-predict fits the one-node points (1 and 2 ranks)
# with bench comm's intra-node and world scopes and predicts the 4-rank points, which
# cross the shaped link. Their error must stay within SHAPED_BOUND; communication is most
# of the step there, so the network's terms, not only compute, decide it.
#
# The bound and its reason: the emulated nodes share the host's cores, so the 4-rank
# point runs four busy-polling MPI ranks on what ran two (contention the one-node fit
# never saw, which on two shared cores moves a collective's time by a factor of two or
# more: bench comm's 1 KiB reduce-scatter inside a node takes milliseconds there), and
# Open MPI picks its own allreduce algorithm by size, which the model's ring only
# approximates through bench comm's calibration. Both are CPU-side noise of this
# emulation, not the network terms the check is for; 35 % is the bound set for that noise.
# Where the 4-rank step does not follow the rate (contention outweighing the link), the
# check tests the model against that contention more than against the link: the printed
# measured steps of the two rates say which.
SHAPED_BOUND=${SHAPED_BOUND:-0.35}
SHAPED_RATES=${SHAPED_RATES:-"40mbit 10mbit"}
SHAPED_DELAY=${SHAPED_DELAY:-1ms}

# Shapes (or, with "none", frees) the link: each node's egress on its veth end. netem
# gives the rate and the delay; a kernel without it (sch_netem) gets tbf, the rate alone,
# and the delay is then the veth's own.
shape_link() {
  local rate=$1 node
  for node in 0 1; do
    local in_ns=(nsenter --net="/run/netns/${namespaces[$node]}")
    if [ "$rate" = none ]; then
      "${in_ns[@]}" tc qdisc del dev "$interface" root 2>/dev/null || true
    elif ! "${in_ns[@]}" tc qdisc replace dev "$interface" root netem rate "$rate" \
        delay "$SHAPED_DELAY" 2>/dev/null; then
      [ "$node" = 0 ] && echo "netem is not in this kernel: the link is shaped to $rate by tbf, without a delay"
      "${in_ns[@]}" tc qdisc replace dev "$interface" root tbf rate "$rate" burst 64kb latency 400ms
    fi
  done
}

shaped_network_file() {
  # The link's rate and latency are what bench comm calibrates; MPI has no NCCL tuning
  # constants, so the per-call and per-step latencies start at zero and are fitted.
  cat > "$1" <<EOF
[network]
name = two namespaced nodes, link shaped to $2
gpus_per_node = 2
intra_bandwidth_gb_per_s = 100
inter_bandwidth_gb_per_s = 0.001
base_latency_us = 0
intra_latency_us = 0
inter_latency_us = 0
source = tests/slurm/shaped_link_predict.sh
EOF
}

shaped_link_check() {
  local rate=$1 work="$SLURM_TEST_WORK/shaped-$1"
  mkdir -p "$work"
  echo "== shaped link $rate, delay $SHAPED_DELAY: sweep, bench comm, prediction"
  shape_link "$rate"
  sed -e 's/^strategies = .*/strategies = ddp/' -e 's/^overlap = .*/overlap = on/' \
    -e 's/^repeats = .*/repeats = 2/' -e "s/^name = .*/name = shaped-$rate/" \
    "$SCALESTUDY_ROOT/experiments/two-nodes-cpu.ini" > "$work/shaped.ini"
  in_cluster "$python" "$SCALESTUDY_ROOT/jobscripts/sweep.py" "$work/shaped.ini" \
    --output-dir "$work/results" --launcher slurm --submit --binary "$binary"
  slurm_wait_for_jobs 600
  slurm_sweep_complete "$python" "$work/shaped.ini" "$work/results"
  in_cluster srun --mpi=pmix --nodes=2 --ntasks-per-node=2 --time=5 "$binary" bench comm \
    --max-bytes 256K --warmup 1 --repeats 3 --min-sample-ms 0.2 --comm-timeout 60 \
    -o "$work/bench-comm.h5"
  shaped_network_file "$work/network.ini" "$rate"
  "$python" -m scalestudy_analysis.predict.cli "$work/results" --network "$work/network.ini" \
    --bench-comm "$work/bench-comm.h5" --no-ledger --resamples 20 --out "$work/prediction"
  "$python" "$SCALESTUDY_ROOT/tests/slurm/check_shaped_prediction.py" \
    "$work/prediction/predictions.json" "$work/results" "$SHAPED_BOUND" "$rate"
  shape_link none
}

for shaped_rate in $SHAPED_RATES; do
  shaped_link_check "$shaped_rate"
done
