#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "cli/backend_setup.h"
#include "cli/commands.h"
#include "cli/train_check.h"
#include "comm/mpi_runtime.h"
#include "config/run_config.h"
#include "core/check.h"
#include "control/control_wait.h"
#include "core/memory_estimate.h"
#include "control/stop_signal.h"
#include "core/usage_error.h"
#include "model/flops.h"
#include "results/run_recorder.h"
#include "train/trainer.h"

namespace scalestudy {
namespace {

void print_header(const RunConfig& c, const Trainer& trainer, const ProcessPlacement& where) {
  const ParameterLayout layout = make_parameter_layout(c.shape);
  std::printf("scalestudy train: model %s (%d layers, hidden %d, %d heads, vocab %d, %s), %zu parameters\n",
              c.model.c_str(), c.shape.layers, c.shape.channels, c.shape.heads, c.shape.vocab,
              c.shape.causal ? "causal" : "bidirectional", layout.param_elems);
  std::printf("  %d rank(s) on %d node(s), backend %s %s, strategy %s, overlap %s, %zu bucket(s) of at most %.2f MiB, "
              "gradients reduced in %s\n",
              where.world_size, where.node_count, c.backend.c_str(), precision_name(c.precision),
              strategy_name(c.strategy), c.overlap ? "on" : "off", trainer.plan().buckets.size(),
              static_cast<double>(trainer.plan().bucket_elems) * sizeof(float) / (1024.0 * 1024.0),
              precision_name(c.grad_reduce));
  if (c.overlapped_ctas > 0)
    std::printf("  collectives that compute still hides run NCCL's kernels on at most %d CTAs (--overlapped-ctas)\n",
                c.overlapped_ctas);
  if (c.overlap_after > 0)
    std::printf("  buckets start once backward has finished %.0f%% of the gradients (--overlap-after %g)\n",
                100.0 * c.overlap_after, c.overlap_after);
  std::printf("  %s scaling: global batch %d = %d rank(s) x %d, %d micro-batch(es) of %d, seq %d; data %s\n",
              scaling_name(c.scaling), c.global_batch, where.world_size, c.batch_per_rank, c.grad_accum,
              c.micro_batch(), c.seq, trainer.data().describe().c_str());
  std::printf("  %s\n", trainer.memory_preflight().describe().c_str());
  if (!c.output.empty())
    std::printf("  result file: at most %.0f KiB (the disk preflight's bound)\n",
                std::ceil(result_file_bytes_bound(c, trainer.plan().buckets.size()) / 1024));
  std::printf("  %s\n", trainer.memory_summary("before the first step").c_str());
  std::fflush(stdout);
}

void print_summary(const Trainer& trainer, const RunRecorder& recorder, const RunSummary& s) {
  const auto& steps = recorder.steps();
  std::printf("summary: loss %.4f -> %.4f", steps.front().loss, steps.back().loss);
  if (auto entropy = trainer.data().entropy_rate_nats()) std::printf(" (source entropy rate %.4f)", *entropy);
  std::printf("\n  median step %.2f ms [IQR %.2f-%.2f] over %lld measured steps, %.0f tokens/s, %.4f TFLOP/s per rank\n",
              s.step_time_median_s * 1e3, s.step_time_q1_s * 1e3, s.step_time_q3_s * 1e3,
              static_cast<long long>(s.steps_measured), s.tokens_per_s, s.tflops_per_gpu);
  if (s.recompute_flops_per_step > 0)
    std::printf("  with recomputation %.4f TFLOP/s per rank executed (%.2f TFLOP per step recomputed)\n",
                (s.flops_per_step + s.recompute_flops_per_step) / s.step_time_median_s /
                    static_cast<double>(trainer.config().world_size) / 1e12,
                s.recompute_flops_per_step / 1e12);
  if (std::isfinite(s.mfu))
    std::printf("  MFU %.1f%% of %.3f TFLOP/s (%s)\n", 100.0 * s.mfu, s.peak_tflops_per_gpu, s.peak_source.c_str());
  // One rank exchanges nothing with a peer: its collectives' share left exposed says
  // nothing, as in the report, which shows no exposed fraction there.
  if (trainer.config().world_size > 1)
    std::printf("  communication %.2f ms per step, %.2f ms of it exposed (%.0f%%)\n", s.comm_time_median_s * 1e3,
                s.exposed_comm_median_s * 1e3, 100.0 * s.exposed_comm_fraction);
  else
    std::printf("  communication: none between ranks (one rank)\n");
  if (const GpuStateSummary gpu = summarize_gpu_state(steps); gpu.samples > 0) {
    std::printf("  GPU state over the measured steps, %lld samples: SM clock %.0f MHz (median of the steps' means; "
                "lowest %.0f), power %.0f W, hottest %.0f C, clocks held by the power cap in %.0f%% of samples\n",
                static_cast<long long>(gpu.samples), gpu.sm_clock_median_mhz, gpu.sm_clock_min_mhz, gpu.power_median_w,
                gpu.temperature_max_c, 100.0 * gpu.power_capped);
    std::string by_phase;
    for (Phase phase : {Phase::forward, Phase::backward, Phase::grad_comm, Phase::optimizer, Phase::param_gather}) {
      const double clock = gpu.phase_sm_clock_median_mhz[static_cast<size_t>(phase)];
      if (std::isnan(clock)) continue;
      char part[64];
      std::snprintf(part, sizeof(part), "%s%s %.0f", by_phase.empty() ? "" : ", ", phase_name(phase), clock);
      by_phase += part;
    }
    if (!by_phase.empty()) std::printf("  SM clock by phase (MHz, median of the steps' means): %s\n", by_phase.c_str());
  }
  if (trainer.config().profile_kernels) {
    const TracingCost cost = tracing_cost(steps);
    std::printf("  kernel tracing: traced steps %.2f ms (mean) against %.2f ms (median untraced), %+.1f%%\n",
                cost.traced_step_time_mean_s * 1e3, cost.untraced_step_time_median_s * 1e3,
                100.0 * (cost.traced_step_time_mean_s / cost.untraced_step_time_median_s - 1.0));
  }
  if (!recorder.output().empty()) std::printf("  results: %s\n", recorder.output().c_str());
}

// An allocation failed although the preflight let the run start (another process took
// the memory, or the estimate fell short): the job ends once, with one line naming the
// rank, what was being allocated and when, and the result file (which rank 0 writes) is
// marked failed with it. The peers may wait in a collective for this rank, so the job is
// ended rather than this rank alone.
[[noreturn]] void end_out_of_memory(RunRecorder& recorder, int rank, const std::string& what) {
  recorder.finish_failed("rank " + std::to_string(rank) + ": " + what);
  end_job(what, 1);
}

std::unique_ptr<Trainer> allocate_trainer(TrainingSetup setup, const BackendSetup& backend, RunRecorder& recorder,
                                          int rank) {
  try {
    return std::make_unique<Trainer>(std::move(setup), *backend.ops, *backend.comm, MPI_COMM_WORLD);
  } catch (const OutOfMemoryError& error) {
    end_out_of_memory(recorder, rank, OutOfMemoryError(error, "before the first step").what());
  } catch (const std::bad_alloc&) {
    end_out_of_memory(recorder, rank, "out of host memory before the first step");
  }
}

// The CUPTI tracer of --profile-kernels, attached to the trainer; null without it.
std::unique_ptr<KernelTracer> attach_kernel_tracer(const RunConfig& config, const BackendSetup& backend,
                                                   Trainer& trainer) {
  if (!config.profile_kernels) return nullptr;
  std::unique_ptr<KernelTracer> tracer = backend.ops->make_kernel_tracer();
  SCALESTUDY_CHECK(tracer != nullptr, "the validated --profile-kernels reached a backend without a tracer");
  if (void* stream = backend.comm->native_stream()) tracer->name_stream("comm", stream);
  trainer.set_kernel_tracer(tracer.get(), config.profile_first, config.profile_last);
  return tracer;
}

// The steps, and the kernel trace recorded after them; a failure marks the file failed.
RunOutcome run_steps(Trainer& trainer, RunRecorder& recorder, KernelTracer* tracer, const RunConfig& config,
                     int rank) {
  try {
    RunOutcome outcome = trainer.run(&recorder);
    set_control_step(0);
    if (tracer) {
      const RankTrace trace = tracer->take_trace();
      if (rank == 0)
        std::printf("kernel profile: steps %d-%d traced, %zu records on rank 0\n", config.profile_first,
                    config.profile_last, trace.records.size());
      recorder.record_kernel_trace(trace, config.profile_first, config.profile_last);
    }
    return outcome;
  } catch (const OutOfMemoryError& error) {
    end_out_of_memory(recorder, rank, error.what());
  } catch (const std::bad_alloc&) {
    end_out_of_memory(recorder, rank, "out of host memory during the steps");
  } catch (const std::exception& error) {
    recorder.finish_failed(std::string("rank ") + std::to_string(rank) + ": " + error.what());
    throw;
  }
}

// A run that a signal stopped or a failure ended: its file marked failed with the reason,
// and the exit code.
int finish_unfinished(const RunOutcome& outcome, RunRecorder& recorder, int rank) {
  std::string reason = outcome.failure;
  if (outcome.stop_signal) {
    // A stopped rank, woken by the teardown, may still finish the step that its peers
    // gave up on: the cause is then the reporting rank's, not the signal.
    defer_to_reporting_rank_if_continued();
    reason = stop_reason(outcome.stop_signal) + " after step " + std::to_string(outcome.steps_completed);
  }
  recorder.finish_failed(reason);
  if (rank == 0) {
    std::fprintf(stderr, "scalestudy train: %s; the result file keeps the %d completed steps, marked failed\n",
                 reason.c_str(), outcome.steps_completed);
    std::fflush(stderr);
  }
  return outcome.stop_signal ? stop_exit_code(outcome.stop_signal) : 1;
}

// A run that completed: its summary, memory and GEMM choices printed, and the exit code.
int finish_completed(Trainer& trainer, RunRecorder& recorder, const BackendSetup& backend, const RunConfig& config,
                     int rank) {
  const MemoryReport memory = trainer.memory();
  const RunSummary summary = recorder.finish_complete(memory);
  const double peak_mib = static_cast<double>(memory.peak_bytes) / (1024.0 * 1024.0);
  double largest_peak_mib = 0.0;
  control_allreduce(&peak_mib, &largest_peak_mib, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, "memory report");
  const std::string memory_line = trainer.memory_summary("after the last step");
  if (rank == 0) {
    print_summary(trainer, recorder, summary);
    std::printf("  %s\n", memory_line.c_str());
    std::printf("  peak memory %.1f MiB on the largest rank (%s)\n", largest_peak_mib, memory.peak_source.c_str());
    const std::vector<std::string> choices = backend.ops->algorithm_choices();
    if (!choices.empty()) std::printf("  GEMM algorithms on rank 0 (--gemm-algos %s):\n", gemm_algos_name(config.gemm_algos));
    for (const std::string& choice : choices) std::printf("    %s\n", choice.c_str());
  }
  if (rank == 0 && !recorder.file_failure().empty()) {
    std::fprintf(stderr, "scalestudy train: %s is not complete: %s\n", recorder.output().c_str(),
                 recorder.file_failure().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int run_train_command(int argc, const char* const* argv) {
  RunConfig config;
  if (!parse_train_config(argc, argv, config)) {
    if (rank_in_world() == 0) std::printf("%s", train_help().c_str());
    return 0;
  }
  if (config.check_only) return run_train_check(config);
  int started = 0;
  MPI_Initialized(&started);
  SCALESTUDY_CHECK(started, "a run reached train without MPI, as if it were train --check");
  // From here on SIGTERM, SIGINT and SIGUSR1 stop the run cleanly (control/stop_signal.h).
  install_stop_signal_handlers();
  const int rank = rank_in_world();
  set_control_timeout(config.comm_timeout_s);
  config.attention_kernel = choose_attention_kernel(config.backend, config.precision, config.attention_kernel);
  // The node split and the communicators' set-up wait for every peer, with no deadline of
  // their own.
  std::optional<BlockingCallDeadline> startup(std::in_place, "the start-up (node split, backend, communicator)", rank);
  const ProcessPlacement where = discover_placement(MPI_COMM_WORLD);
  BackendSetup backend = make_backend(config.backend_config(), where);
  startup.reset();
  // Bad input, a run too large for the memory included, is refused here, before the
  // result file exists and before anything is allocated.
  TrainingSetup setup = prepare_training(config, *backend.ops, *backend.comm, MPI_COMM_WORLD);

  RunIdentity identity = backend.identity;
  identity.argv.assign(argv, argv + argc);
  identity.argv.insert(identity.argv.begin(), "scalestudy");
  RunRecorder recorder(setup.config, identity, MPI_COMM_WORLD,
                       MemoryPreflightRecord{setup.memory.estimate, setup.memory.available_bytes});
  const std::unique_ptr<Trainer> owned_trainer = allocate_trainer(std::move(setup), backend, recorder, where.rank);
  Trainer& trainer = *owned_trainer;
  if (where.rank == 0) print_header(trainer.config(), trainer, where);
  const std::unique_ptr<KernelTracer> tracer = attach_kernel_tracer(config, backend, trainer);
  trainer.set_gpu_telemetry(backend.telemetry.get());
  const RunOutcome outcome = run_steps(trainer, recorder, tracer.get(), config, where.rank);
  if (outcome.stop_signal || !outcome.failure.empty()) return finish_unfinished(outcome, recorder, where.rank);
  return finish_completed(trainer, recorder, backend, config, where.rank);
}

}  // namespace scalestudy
