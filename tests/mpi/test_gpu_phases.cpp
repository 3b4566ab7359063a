// The GPU state by phase, from the trainer to the result file: each rank's samples are
// placed in the phases of its steps, gathered to rank 0 and written as
// /steps/gpu_phase_* (docs/results-schema.md, "The GPUs' state by phase"). The CPU has
// no GPU to sample, so a thread here samples made-up values, stamped as NVML's are.
// Run by ctest at 1, 2, 3 and 4 ranks.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "results/run_recorder.h"
#include "train/trainer.h"
#include "training.h"

namespace scalestudy {
namespace {

constexpr double kClockMhz = 1500.0;
constexpr double kPowerW = 600.0;

// Samples every 200 µs, each the same reading, stamped with the host's clock.
class ThreadTelemetry final : public GpuTelemetry {
 public:
  ThreadTelemetry() : thread_([this] { run(); }) {}
  ~ThreadTelemetry() override {
    stopping_ = true;
    thread_.join();
  }
  std::vector<GpuSample> take_samples() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(samples_, {});
  }

 private:
  void run() {
    while (!stopping_) {
      GpuSample s;
      s.taken_at = std::chrono::steady_clock::now();
      s.sm_clock_mhz = kClockMhz;
      s.power_w = kPowerW;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        samples_.push_back(s);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::mutex mutex_;
  std::vector<GpuSample> samples_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;  // last: it starts once the members it uses exist
};

// Keeps this rank's own records and passes them on to the recorder.
class KeepingObserver final : public StepObserver {
 public:
  explicit KeepingObserver(StepObserver& next) : next_(next) {}
  void on_step(const StepRecord& record) override {
    records.push_back(record);
    next_.on_step(record);
  }
  std::vector<StepRecord> records;

 private:
  StepObserver& next_;
};

std::vector<int64_t> read_int64_dataset(const std::string& path, const char* name) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
  const hid_t space = H5Dget_space(dataset);
  std::vector<int64_t> values(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  EXPECT_GE(H5Dread(dataset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
  return values;
}

TEST(GpuPhases, EachRanksSamplesLieInItsPhasesAndReachTheFile) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::string output = "test_gpu_phases_np" + std::to_string(world) + ".h5";
  const RunConfig config =
      parse_train_options({"--model", "tiny", "--layers", "2", "--seq", "32", "--global-batch", "12", "--steps", "6",
                           "--warmup-steps", "1", "--strategy", "ddp", "--overlap", "on", "--output", output});
  CpuOps ops;
  MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
  ThreadTelemetry telemetry;
  Trainer trainer(config, ops, comm, MPI_COMM_WORLD);
  trainer.set_gpu_telemetry(&telemetry);
  RunRecorder recorder(trainer.config(), RunIdentity{}, MPI_COMM_WORLD);
  KeepingObserver observer(recorder);
  trainer.run(&observer);
  (void)recorder.finish_complete(trainer.memory());

  std::vector<int64_t> mine;  // [step][phase] samples of this rank
  int64_t compute_samples = 0;
  for (const StepRecord& record : observer.records) {
    const PhaseGpuState& step = record.gpu_phases[static_cast<size_t>(Phase::step)];
    EXPECT_LE(step.samples, record.gpu_state.samples) << "the step's samples are some of those taken";
    for (int p = 0; p < kPhaseCount; ++p) {
      const PhaseGpuState& phase = record.gpu_phases[static_cast<size_t>(p)];
      EXPECT_LE(phase.samples, step.samples) << phase_name(static_cast<Phase>(p)) << " lies inside the step";
      // Every sample read the same values, so every phase that holds one has them exactly.
      if (phase.samples > 0) {
        EXPECT_EQ(phase.sm_clock_mhz, kClockMhz) << phase_name(static_cast<Phase>(p));
        EXPECT_EQ(phase.power_w, kPowerW) << phase_name(static_cast<Phase>(p));
      } else {
        EXPECT_TRUE(std::isnan(phase.sm_clock_mhz) && std::isnan(phase.power_w)) << phase_name(static_cast<Phase>(p));
      }
      mine.push_back(phase.samples);
    }
    compute_samples += record.gpu_phases[static_cast<size_t>(Phase::forward)].samples +
                       record.gpu_phases[static_cast<size_t>(Phase::backward)].samples;
  }
  EXPECT_GT(compute_samples, 0) << "6 steps of forward and backward, sampled every 200 µs, hold none";

  // Rank 0 gathered every rank's, and wrote them as [S, R, P].
  std::vector<int64_t> all(rank == 0 ? mine.size() * world : 0);
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(), static_cast<int>(mine.size()),
             MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    const size_t steps = observer.records.size();
    const std::vector<int64_t> written = read_int64_dataset(output, "/steps/gpu_phase_samples");
    ASSERT_EQ(written.size(), steps * world * kPhaseCount);
    for (size_t s = 0; s < steps; ++s)
      for (int r = 0; r < world; ++r)
        for (int p = 0; p < kPhaseCount; ++p) {
          const int64_t sent = all[(static_cast<size_t>(r) * steps + s) * kPhaseCount + p];
          EXPECT_EQ(written[(s * world + r) * kPhaseCount + p], sent) << "step " << s << " rank " << r << " phase " << p;
          EXPECT_EQ(recorder.steps()[s].gpu_phases[r][p].samples, sent) << "step " << s << " rank " << r;
        }
    std::remove(output.c_str());
  }
}

}  // namespace
}  // namespace scalestudy
