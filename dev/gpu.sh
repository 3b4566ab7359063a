#!/usr/bin/env bash
# The GPU-node measurements of scalestudy itself, one command each, from a bundle
# (dev/README.md), from the repository root:
#   dev/gpu.sh COMMAND OUTPUT_DIR
# Settings are environment variables, named in each command's comment below.
set -uo pipefail

usage() {
  echo "usage: $0 ab|per-device|state|profile|bench OUTPUT_DIR" >&2
  exit 2
}

# A/B on a GPU node: the GPT-2 small bf16 step on GPUS GPUs (default 1) at BATCH per GPU
# (default 32) for each of BINARIES (executables in the bundle, default "scalestudy"), each
# with each of VARIANTS (train options; variants separated by "|"; default none),
# alternated ROUNDS times (default 2), so that a change is measured against the binary or
# the option before it on the same GPUs in one run. Writes ab.log into OUTPUT_DIR.
#   GPUS=2 VARIANTS="--overlap-after 0|--overlap-after 0.5" dev/gpu.sh ab OUTPUT_DIR
run_ab() {
  log="$out/ab.log"
  nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
  for name in ${BINARIES:-scalestudy}; do
    echo "$name: $("$bundle/$name" --version)" | tee -a "$log"
  done
  IFS='|' read -r -a variants <<< "${VARIANTS:-}"
  [ ${#variants[@]} -eq 0 ] && variants=("")
  for round in $(seq "${ROUNDS:-2}"); do
    for name in ${BINARIES:-scalestudy}; do
      for variant in "${variants[@]}"; do
        # The first round also keeps the GEMM algorithms each run chose.
        keep="median step|exposed"
        [ "$round" = 1 ] && keep="median step|exposed|GEMM algorithms|^    (bias|gelu|dgelu|plain)"
        $mpirun -np "${GPUS:-1}" "$bundle/$name" $timed_train $variant 2>&1 | grep -E "$keep" |
          sed "s|^|[$name${variant:+ $variant}] |" | tee -a "$log"
      done
    done
  done
}

# The one-GPU step of GPT-2 small bf16 at BATCH per GPU (default 32) on each visible GPU
# alone, in turn, REPEATS times (default 3). A scaling study's one-GPU baseline runs on
# GPU 0, while a data-parallel step waits for its slowest GPU: this shows how far apart
# the node's GPUs are. Writes per-device.log into OUTPUT_DIR.
#   dev/gpu.sh per-device OUTPUT_DIR
run_per_device() {
  log="$out/per-device.log"
  "$binary" --version | tee "$log"
  nvidia-smi --query-gpu=index,name,pci.bus_id,clocks.max.sm,power.limit --format=csv | tee -a "$log"
  for repeat in $(seq "${REPEATS:-3}"); do
    for gpu in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
      CUDA_VISIBLE_DEVICES=$gpu $mpirun -x CUDA_VISIBLE_DEVICES -np 1 "$binary" $timed_train 2>&1 |
        grep "median step" | sed "s/^/[GPU $gpu alone] /" | tee -a "$log"
    done
  done
}

# What communication costs a power-capped GPU: the step of GPT-2 small bf16 at BATCH per
# GPU (default 64) with each rank's GPU state sampled every PERIOD ms (default 10) on GPU 0
# alone, on GPU 1 alone, on both at once as two independent one-GPU runs (no
# communication), and on both with ddp+overlap and zero2+overlap; then GPU 0 alone without
# sampling, to show what sampling costs. Alternated ROUNDS times (default 2). Prints each
# run's median step and GPU state into state.log, and keeps the result files in
# OUTPUT_DIR/runs/ (scalestudy-report OUTPUT_DIR/runs -o REPORT_DIR reads them).
#   dev/gpu.sh state OUTPUT_DIR
run_state() {
  log="$out/state.log"
  runs="$out/runs"
  mkdir -p "$runs"
  nvidia-smi --query-gpu=index,name,uuid,power.limit --format=csv | tee "$log"
  echo "scalestudy: $("$binary" --version), batch $BATCH per GPU" | tee -a "$log"
  sampled="--gpu-telemetry-ms ${PERIOD:-10}"
  lines() {  # lines LABEL: the run's figures, labelled
    grep -E "median step|GPU state|SM clock by phase" | sed "s/^/[$1] /"
  }
  one_gpu() {  # one_gpu DEVICE LABEL FILE [options]
    local device=$1 label=$2 file=$3
    shift 3
    CUDA_VISIBLE_DEVICES=$device $mpirun -np 1 -x CUDA_VISIBLE_DEVICES "$binary" $timed_train "$@" \
      --output "$runs/$file.h5" 2>&1 | lines "$label"
  }
  for round in $(seq "${ROUNDS:-2}"); do
    one_gpu 0 "GPU 0 alone" "r$round-gpu0-alone" $sampled | tee -a "$log"
    one_gpu 1 "GPU 1 alone" "r$round-gpu1-alone" $sampled | tee -a "$log"
    one_gpu 0 "GPU 0 beside GPU 1" "r$round-gpu0-beside" $sampled > "$out/.beside0" &
    beside0=$!
    one_gpu 1 "GPU 1 beside GPU 0" "r$round-gpu1-beside" $sampled > "$out/.beside1" &
    wait "$beside0" $!
    cat "$out/.beside0" "$out/.beside1" | tee -a "$log"
    for strategy in ddp zero2; do
      $mpirun -np 2 "$binary" $timed_train --strategy "$strategy" --overlap on $sampled \
        --output "$runs/r$round-2gpu-$strategy.h5" 2>&1 | lines "2 GPUs $strategy+overlap" | tee -a "$log"
    done
    one_gpu 0 "GPU 0 alone, not sampled" "r$round-gpu0-unsampled" --gpu-telemetry-ms 0 | tee -a "$log"
  done
  rm -f "$out/.beside0" "$out/.beside1"
}

# On a GPU node of 2 GPUs or more, from a bundle: every GPU test of the bundle, then the
# kernel profile (--profile-kernels) of GPT-2 small bf16 with ddp+overlap on each of
# PROFILE_GPUS (default "1 2") GPUs and of one traced GEMM benchmark, the untraced
# throughput at each of BATCHES (default "8 16") and, with --recompute on, of
# RECOMPUTE_BATCHES (default 32), then peers/bench_vs_pytorch.py for each of MODELS
# (default gpt2-small) at TORCH_BATCH per GPU (default 16) on TORCH_GPUS (default "1 2").
# TESTS=0, PROFILE=0, THROUGHPUT=0 or VS_TORCH=0 skips a part. Writes the logs into
# OUTPUT_DIR and the result files into OUTPUT_DIR/profile/ (scalestudy-report reads them).
#   dev/gpu.sh profile OUTPUT_DIR
run_profile() {
  { "$binary" --version; nvidia-smi -L; } | tee "$out/machine.txt"

  if [ "${TESTS:-1}" = 1 ]; then
    echo "== GPU tests" | tee "$out/gpu-tests.log"
    for test in "$bundle"/test_*; do
      [ -x "$test" ] || continue
      timeout 600 $mpirun -np 1 "$test" >>"$out/gpu-tests.log" 2>&1
      echo "$(basename "$test"): exit $?" | tee -a "$out/gpu-tests.log"
    done
    for test in "$bundle"/mpi_test_*; do
      [ -x "$test" ] || continue
      timeout 600 $mpirun -np 2 "$test" >>"$out/gpu-tests.log" 2>&1
      echo "$(basename "$test") (2 GPUs): exit $?" | tee -a "$out/gpu-tests.log"
    done
    grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/gpu-tests.log"
  fi

  if [ "${PROFILE:-1}" = 1 ]; then
    echo "== kernel profile" | tee "$out/profile.log"
    mkdir -p "$out/profile"
    common="train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank ${PROFILE_BATCH:-8} --steps 12
            --warmup-steps 3 --profile-kernels --profile-window 5-7 --experiment kernel-profile --log-every 4
            --strategy ddp --overlap on"
    for n in ${PROFILE_GPUS:-1 2}; do
      $mpirun -np "$n" "$binary" $common --output "$out/profile/profile-n$n.h5" 2>&1 | tee -a "$out/profile.log" | tail -8
    done
    "$binary" bench gemm --backend cuda --sizes 512,4096 --precisions bf16 --profile-kernels \
      -o "$out/profile/bench-gemm-traced.h5" 2>&1 | tee -a "$out/profile.log" | tail -4
  fi

  if [ "${THROUGHPUT:-1}" = 1 ]; then
    echo "== throughput (untraced)" | tee "$out/throughput.log"
    for batch in ${BATCHES:-8 16}; do
      $mpirun -np 1 "$binary" train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank "$batch" \
        --steps 20 --warmup-steps 5 --log-every 20 2>&1 | tee -a "$out/throughput.log" | grep -E "median step|MFU"
    done
    for batch in ${RECOMPUTE_BATCHES:-32}; do
      echo "-- --recompute on, batch $batch" | tee -a "$out/throughput.log"
      $mpirun -np 1 "$binary" train --backend cuda --model gpt2-small --seq 1024 --batch-per-rank "$batch" \
        --recompute on --steps 20 --warmup-steps 5 --log-every 20 2>&1 | tee -a "$out/throughput.log" |
        grep -E "median step|recomputation|MFU|peak memory"
    done
  fi

  if [ "${VS_TORCH:-1}" = 1 ]; then
    echo "== against PyTorch" | tee "$out/vs-torch.log"
    for model in ${MODELS:-gpt2-small}; do
      seq=1024
      case "$model" in bert-*) seq=512 ;; esac  # BERT's position table ends at 512
      "${PYTHON:-python3}" peers/bench_vs_pytorch.py --binary "$binary" --model "$model" --seq "$seq" \
        --gpus ${TORCH_GPUS:-1 2} --precision bf16 --batch-per-gpu "${TORCH_BATCH:-16}" --pytorch-gpus 1 \
        --pytorch-modes ${TORCH_MODES:-eager compile} --workdir "$out/vs-torch-$model" 2>&1 |
        tee -a "$out/vs-torch.log" | tail -14
    done
  fi
}

# The micro-benchmark suite on a GPU node of 2 GPUs or more (GEMM, bandwidth, layer,
# inference, and the collectives on 2 GPUs), and its comparison with PyTorch (bf16 GEMM
# against torch.matmul, 1 GiB allreduce busbw against torch.distributed). Writes the HDF5
# files and logs into OUTPUT_DIR; scalestudy-bench-report OUTPUT_DIR/*.h5 -o REPORT_DIR
# draws the tables and the roofline. PYTHON is a Python with PyTorch (default python3).
#   dev/gpu.sh bench OUTPUT_DIR
run_bench() {
  log="$out/bench.log"
  "$binary" --version | tee "$log"
  nvidia-smi -L | tee -a "$log"

  for bench in gemm bandwidth; do
    "$binary" bench $bench --backend cuda -o "$out/$bench.h5" 2>&1 | tee -a "$log" | tail -3
  done
  for bench in layer inference; do
    "$binary" bench $bench --backend cuda --repeats "${REPEATS:-5}" -o "$out/$bench.h5" 2>&1 | tee -a "$log" | tail -3
  done
  $mpirun -np 2 "$binary" bench comm --backend cuda -o "$out/comm.h5" 2>&1 | tee -a "$log" | tail -3

  echo "== against PyTorch" | tee -a "$log"
  "${PYTHON:-python3}" peers/bench_gpu_vs_torch.py --binary "$binary" --workdir "$out/vs-torch" 2>&1 |
    tee "$out/vs-torch.log" | tail -12
}

command=${1:-}
case "$command" in
  ab | per-device | state | profile | bench) ;;
  *) usage ;;
esac
[ -n "${2:-}" ] || usage
# The state command times at batch 64 by default, the others at 32 (gpu_env.sh).
[ "$command" = state ] && export BATCH=${BATCH:-64}
source "$(dirname "$0")/gpu_env.sh" "$2"
"run_${command//-/_}"
