#include "train/trainer.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "control/mpi_check.h"
#include "control/control_wait.h"
#include "core/memory_estimate.h"
#include "control/stop_signal.h"
#include "core/usage_error.h"
#include "data/token_source.h"
#include "train/consistency.h"

namespace scalestudy {

std::unique_ptr<TokenSource> make_checked_token_source(const RunConfig& c) {
  std::unique_ptr<TokenSource> data = make_token_source(c.data, c.shape.vocab, c.seed, c.token_file);
  data->check_holds_sample(c.seq);
  if (data->vocab_size() > c.shape.vocab)
    throw UsageError("--vocab " + std::to_string(c.shape.vocab) + ": smaller than the data's vocabulary (" +
                     std::to_string(data->vocab_size()) + ")");
  return data;
}

TrainingSetup prepare_training(const RunConfig& config, const Backend& backend, const Communicator& comm,
                               MPI_Comm control) {
  int control_size = 0;
  CHECK_MPI(MPI_Comm_size(control, &control_size));
  SCALESTUDY_CHECK(control_size == comm.world_size(), "the control communicator must hold the same ranks");
  TrainingSetup setup;
  setup.config = config;
  RunConfig& c = setup.config;
  resolve_for_world(c, comm.world_size());
  check_same_config(control, describe_config(c));

  setup.data = make_checked_token_source(c);
  const ParameterLayout layout = make_parameter_layout(c.shape);
  setup.plan = make_bucket_plan(layout.param_elems, c.data_parallel().bucket_bytes, comm.world_size(),
                                layout.segments[layout.embedding_segment()].end_elems);
  check_output_space(c, setup.plan.buckets.size());
  setup.memory = check_training_memory(c, setup.plan, backend, comm, control);
  return setup;
}

Trainer::Trainer(const RunConfig& config, Backend& backend, Communicator& comm, MPI_Comm control)
    : Trainer(prepare_training(config, backend, comm, control), backend, comm, control) {}

Trainer::Trainer(TrainingSetup setup, Backend& backend, Communicator& comm, MPI_Comm control)
    : config_(std::move(setup.config)), backend_(backend), comm_(comm), control_(control),
      data_(std::move(setup.data)), plan_(setup.plan), memory_preflight_(setup.memory),
      timer_(backend.make_step_timer()), clock_(*timer_) {
  model_ = std::make_unique<Gpt>(backend_, config_.shape, config_.micro_batch(), config_.seq, plan_.padded_elems,
                                 config_.recompute);
  model_->initialize(config_.seed);
  backend_.parameters_changed(model_->params(), 0, plan_.padded_elems);
  strategy_ = make_strategy(config_.data_parallel(), backend_, comm_, *model_, plan_);
  schedule_ = {config_.learning_rate, config_.min_lr_ratio, config_.lr_warmup_steps, config_.steps};
  scaler_ = DynamicLossScaler(config_.loss_scaling, config_.loss_scale_init, config_.loss_scale_growth_interval);

  batches_ = std::make_unique<MicroBatchLoader>(
      *data_, MicroBatchShape{comm_.rank(), config_.global_batch, config_.batch_per_rank,
                              config_.micro_batch(), config_.seq});
  const auto bytes = comm_.payload_bytes_by_kind();
  for (int k = 0; k < kCollectiveKindCount; ++k) bytes_before_[k] = bytes[static_cast<size_t>(k)];
}

Trainer::~Trainer() {
  comm_.finish_all();
  strategy_.reset();
  model_.reset();
}

// Forward and backward of each micro-batch of the step; the sum of the losses of all but
// the last, whose loss is read after the optimizer.
double Trainer::run_micro_batches(int step, float loss_scale) {
  const int micro_batches = config_.grad_accum;
  double loss_sum = 0.0;
  for (int micro = 0; micro < micro_batches; ++micro) {
    {
      ScopedPhase phase(clock_, Phase::data);
      batches_->load(step, micro);
    }
    {
      ScopedPhase phase(clock_, Phase::forward);
      model_->forward(batches_->inputs(), batches_->targets(), strategy_.get(), loss_scale);
    }
    {
      ScopedPhase phase(clock_, Phase::backward);
      strategy_->begin_micro_batch(micro, micro_batches);
      model_->backward(*strategy_, loss_scale);
    }
    // While the device runs the backward just queued (MicroBatchLoader says why). Where
    // the ops run on the calling thread, nothing would run beside the read, and it stays
    // in the next step's data phase.
    if (backend_.runs_asynchronously() && micro + 1 == micro_batches && step + 1 < config_.steps)
      batches_->prefetch(step + 1);
    // Reading the loss makes the host wait for the device, which then idles until the host
    // has queued more work: read right after forward, that idle time fell between forward
    // and backward. It is read as late as the next forward allows, the last micro-batch's
    // after the optimizer, where the step ends.
    if (micro + 1 < micro_batches) loss_sum += model_->mean_loss();
  }
  return loss_sum;
}

// What a step records once its work is done: the replica check, the collectives, the
// phase intervals, the GPU state, the bytes sent, and the kernel trace of a traced step.
void Trainer::finish_step_record(StepRecord& record, int step) {
  if (config_.check_every > 0 && (step + 1) % config_.check_every == 0) {
    const std::vector<float> params = parameters_on_host();
    check_replicas(control_, checksum_bytes(params.data(), params.size() * sizeof(float)), step);
  }
  comm_.finish_all();
  record.collectives = comm_.take_records();
  record.intervals = clock_.finish_step(record.collectives);
  if (telemetry_) {
    const std::vector<GpuSample> samples = telemetry_->take_samples();
    record.gpu_state = summarize_gpu_samples(samples);
    record.gpu_phases = summarize_gpu_samples_by_phase(samples, clock_.host_origin(), record.intervals);
  }
  for (const CollectiveRecord& collective : record.collectives)
    if (!std::isnan(collective.wait_begin_s)) record.comm_wait_s += collective.wait_end_s - collective.wait_begin_s;
  const auto bytes = comm_.payload_bytes_by_kind();
  for (int k = 0; k < kCollectiveKindCount; ++k) {
    record.comm_bytes[k] = bytes[static_cast<size_t>(k)] - bytes_before_[k];
    bytes_before_[k] = bytes[static_cast<size_t>(k)];
  }
  if (record.traced) {
    // Both streams are idle here: finish_step waited for compute, finish_all for comm.
    tracer_->collect(step);
    if (step == trace_last_) tracer_->stop();
  }
}

StepRecord Trainer::train_step(int step) {
  StepRecord record;
  record.step = step;
  record.warmup = step < config_.warmup_steps;
  record.learning_rate = schedule_.at(step);
  const int micro_batches = config_.grad_accum;
  record.loss_scale = scaler_.scale();
  const float loss_scale = record.loss_scale / (static_cast<float>(config_.micro_batch()) * config_.seq *
                                                micro_batches * comm_.world_size());

  record.traced = tracer_ && step >= trace_first_ && step <= trace_last_;
  if (record.traced && step == trace_first_) tracer_->start();
  clock_.start_step();
  comm_.set_epoch(clock_.host_origin());
  strategy_->begin_step();
  double loss_sum = run_micro_batches(step, loss_scale);
  // What overlap did not hide is waited for here; the comm stream's own grad-comm
  // interval comes from the collective records below.
  strategy_->finish_gradient_sync();
  OptimizerStats stats;
  {
    ScopedPhase phase(clock_, Phase::optimizer);
    stats = strategy_->optimizer_step(record.learning_rate, applied_updates_ + 1, 1.0f / record.loss_scale);
  }
  loss_sum += model_->mean_loss();
  // The loss is on the host already: summed there, it costs the device no round trip
  // through a device collective at the end of the step. It is bookkeeping, so it goes
  // over the control plane and not through the communicator, whose collectives are the
  // step's timed communication (zero2's gradient norm, part of the update, goes there).
  const double local_loss = loss_sum / micro_batches;
  double global_loss = 0.0;
  control_allreduce(&local_loss, &global_loss, 1, MPI_DOUBLE, MPI_SUM, control_, "loss");
  record.loss = global_loss / comm_.world_size();
  record.grad_norm = stats.grad_norm;
  record.skipped = stats.skipped;
  if (!stats.skipped) ++applied_updates_;
  scaler_.update(!stats.skipped);
  record.tokens = static_cast<int64_t>(config_.global_batch) * config_.seq;

  finish_step_record(record, step);
  return record;
}

void Trainer::set_kernel_tracer(KernelTracer* tracer, int first, int last) {
  SCALESTUDY_CHECK(!tracer || (first >= 0 && first <= last), "a kernel trace window needs 0 <= first <= last");
  tracer_ = tracer;
  trace_first_ = first;
  trace_last_ = last;
}

RunOutcome Trainer::run(StepObserver* observer) {
  // The samples taken while the run was set up belong to no step.
  if (telemetry_) (void)telemetry_->take_samples();
  RunOutcome outcome;
  for (int step = 0; step < config_.steps; ++step) {
    set_control_step(step + 1);  // the control plane's timeouts name the step
    StepRecord record;
    try {
      record = train_step(step);
    } catch (const OutOfMemoryError& error) {
      // The buffers that grow on first use (zero2's staging, the backend's scratch, the
      // communicator's bf16 staging) are allocated inside a step.
      throw OutOfMemoryError(error, "in step " + std::to_string(step + 1));
    }
    if (observer) observer->on_step(record);
    outcome.steps_completed = step + 1;
    if (comm_.rank() == 0 && ((step + 1) % config_.log_every == 0 || step + 1 == config_.steps))
      print_progress(record);
    // The safe point: every rank has finished the step and its record is written. The
    // ranks agree here, outside the timed step, whether any of them was sent a stop signal.
    outcome.stop_signal = agreed_stop_signal();
    if (outcome.stop_signal) return outcome;
    // Every rank holds the same global loss, so every rank stops here alike.
    if (config_.stop_on_nonfinite_loss && !std::isfinite(record.loss)) {
      outcome.failure = "the loss is " + std::string(std::isnan(record.loss) ? "nan" : "inf") + " at step " +
                        std::to_string(step + 1) + " (--nonfinite-loss stop)";
      return outcome;
    }
  }
  strategy_->finish_param_sync();
  return outcome;
}

int Trainer::agreed_stop_signal() const {
  const int mine = stop_signal();
  int agreed = 0;
  control_allreduce(&mine, &agreed, 1, MPI_INT, MPI_MAX, control_, "stop check");
  return agreed;
}

void Trainer::print_progress(const StepRecord& r) const {
  const double step_s = r.intervals[static_cast<int>(Phase::step)].length();
  std::printf("step %*d/%d  loss %.4f  lr %.3e  norm %.3f  %8.1f ms  %10.0f tok/s%s\n",
              static_cast<int>(std::to_string(config_.steps).size()), r.step + 1, config_.steps, r.loss,
              static_cast<double>(r.learning_rate), r.grad_norm, step_s * 1e3,
              step_s > 0 ? static_cast<double>(r.tokens) / step_s : 0.0,
              r.skipped ? "  (skipped: gradients overflowed)" : r.warmup ? "  (warm-up)" : "");
  std::fflush(stdout);
}

std::vector<float> Trainer::parameters_on_host() {
  strategy_->finish_param_sync();
  std::vector<float> host(model_->layout().param_elems);
  backend_.copy_to_host(host.data(), model_->params(), host.size());
  return host;
}

MemoryReport Trainer::memory() const {
  MemoryReport report;
  for (int k = 0; k < kMemoryKindCount; ++k)
    report.bytes[k] = backend_.allocated_bytes(static_cast<MemoryKind>(k));
  report.bytes[static_cast<int>(MemoryKind::communication)] += comm_.staging_bytes();
  report.peak_bytes = backend_.measured_peak_bytes();
  report.peak_source = backend_.peak_source();
  return report;
}

std::string Trainer::memory_summary(const std::string& when) const {
  const MemoryReport report = memory();
  std::ostringstream out;
  out << "memory per rank " << when << ":";
  for (int k = 0; k < kMemoryKindCount; ++k)
    out << " " << memory_kind_name(static_cast<MemoryKind>(k)) << " " << human_bytes(report.bytes[k]);
  return out.str();
}

}  // namespace scalestudy
