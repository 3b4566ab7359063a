#pragma once
// The step loop: data, forward, backward, gradient synchronisation and the optimizer,
// each phase timed on its stream, on one rank of a data-parallel job.
#include <mpi.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/run_config.h"
#include "data/token_source.h"
#include "model/gpt.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/strategy.h"
#include "profile/gpu_state.h"
#include "results/step_record.h"
#include "timing/phases.h"
#include "train/memory_preflight.h"
#include "train/micro_batch_loader.h"

namespace scalestudy {

// How a run ended: every step, or stopped after steps_completed steps by a signal or by a
// failure that every rank saw alike (a non-finite loss).
struct RunOutcome {
  int stop_signal = 0;  // the largest signal number any rank received; 0: none
  std::string failure;  // why the run stopped, where no signal stopped it; empty: it did not
  int steps_completed = 0;
};

// A run checked and planned before it allocates anything: the config resolved for the
// world and checked to be every rank's, the token source, the bucket plan and the memory
// preflight.
struct TrainingSetup {
  RunConfig config;
  std::unique_ptr<TokenSource> data;
  BucketPlan plan;
  MemoryPreflight memory;
};

// control is the MPI communicator for checks that are not part of the measured training
// (config and replica checks, the memory preflight); comm carries the training's
// collectives. Collective over control. Bad input, a run that does not fit in memory
// included, throws UsageError on every rank.
TrainingSetup prepare_training(const RunConfig& config, const Backend& backend, const Communicator& comm,
                               MPI_Comm control);

// The run's token source, checked against the model's vocabulary: what prepare_training
// and `train --check` make alike. Throws UsageError.
std::unique_ptr<TokenSource> make_checked_token_source(const RunConfig& config);

class Trainer {
 public:
  // Allocates the model and the strategy of a prepared run. An allocation that fails
  // despite the preflight throws OutOfMemoryError.
  Trainer(TrainingSetup setup, Backend& backend, Communicator& comm, MPI_Comm control);
  // prepare_training, then the constructor above.
  Trainer(const RunConfig& config, Backend& backend, Communicator& comm, MPI_Comm control);
  ~Trainer();

  // Traces the kernels of steps first..last with `tracer` (--profile-kernels); the
  // tracer outlives the run.
  void set_kernel_tracer(KernelTracer* tracer, int first, int last);
  // Closes a step of `telemetry`'s samples at the end of every step (--gpu-telemetry-ms)
  // into its record; the telemetry outlives the run.
  void set_gpu_telemetry(GpuTelemetry* telemetry) { telemetry_ = telemetry; }
  // Runs every step, telling the observer about each; prints progress on rank 0. After each
  // step the ranks agree whether any was sent a stop signal (control/stop_signal.h), and stop
  // together if one was.
  RunOutcome run(StepObserver* observer);
  StepRecord train_step(int step);

  // The whole parameter vector (unpadded), after any pending parameter sync.
  std::vector<float> parameters_on_host();
  MemoryReport memory() const;
  // "memory per rank (MiB) <when>: parameters ... other ...", memory() as it is now.
  // Before the first step it leaves out the buffers that grow on first use (zero2's
  // bucket staging, the communicator's staging).
  std::string memory_summary(const std::string& when) const;
  const RunConfig& config() const { return config_; }
  const TokenSource& data() const { return *data_; }
  const GradientStrategy& strategy() const { return *strategy_; }
  const BucketPlan& plan() const { return plan_; }
  const MemoryPreflight& memory_preflight() const { return memory_preflight_; }

 private:
  double run_micro_batches(int step, float loss_scale);
  void finish_step_record(StepRecord& record, int step);
  void print_progress(const StepRecord& record) const;
  int agreed_stop_signal() const;

  RunConfig config_;
  Backend& backend_;
  Communicator& comm_;
  MPI_Comm control_;
  std::unique_ptr<TokenSource> data_;
  BucketPlan plan_;
  MemoryPreflight memory_preflight_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<GradientStrategy> strategy_;
  LearningRateSchedule schedule_;
  DynamicLossScaler scaler_{false, 1.0f, 1};
  int applied_updates_ = 0;
  std::unique_ptr<StepTimer> timer_;
  StepClock clock_;
  std::unique_ptr<MicroBatchLoader> batches_;
  std::array<size_t, kCollectiveKindCount> bytes_before_{};
  KernelTracer* tracer_ = nullptr;
  int trace_first_ = -1, trace_last_ = -1;
  GpuTelemetry* telemetry_ = nullptr;
};

}  // namespace scalestudy
