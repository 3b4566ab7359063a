// The kernel profile on 2 GPUs (ddp over NCCL, bf16): per stream, the kernel, copy and set
// times that CUPTI recorded add up to the busy time that the phase intervals measure,
// and NCCL's kernels land in "communication" on the comm stream.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl_communicator.h"
#include "config/run_config.h"
#include "results/run_summary.h"
#include "train/trainer.h"
#include "training.h"

namespace scalestudy {
namespace {

// Kernel time against phase time, per stream: |kernels / phases - 1| <= 5 % (see the
// assertions at the end).
constexpr double kBusyTolerance = 0.05;
constexpr int kSteps = 7, kTraceFirst = 3, kTraceLast = 5;

bool have_two_gpus() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int local_ok = cuda_device_count() >= 1 ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return world == 2 && all_ok == 1;
}

RunConfig profile_config() {
  const std::vector<std::string> args = {
      "--model", "gpt2-small", "--layers", "4", "--seq", "1024", "--batch-per-rank", "16",
      "--steps", std::to_string(kSteps), "--warmup-steps", "2", "--strategy", "ddp", "--overlap", "off",
      "--backend", "cuda", "--precision", "bf16", "--profile-kernels",
      "--profile-window", std::to_string(kTraceFirst) + "-" + std::to_string(kTraceLast)};
  return parse_train_options(args);
}

class KeepRecords final : public StepObserver {
 public:
  void on_step(const StepRecord& record) override { records.push_back(record); }
  std::vector<StepRecord> records;
};

TEST(KernelProfile2Gpu, KernelTimesMatchThePhasesAndNcclIsCommunication) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const ProcessPlacement where = discover_placement(MPI_COMM_WORLD);
  CudaOps ops(where.local_rank, Precision::bf16);
  NcclCommunicator comm(MPI_COMM_WORLD, ops.stream(), 120.0);
  Trainer trainer(profile_config(), ops, comm, MPI_COMM_WORLD);
  std::unique_ptr<KernelTracer> tracer = ops.make_kernel_tracer();
  tracer->name_stream("comm", comm.native_stream());
  trainer.set_kernel_tracer(tracer.get(), kTraceFirst, kTraceLast);
  KeepRecords kept;
  trainer.run(&kept);
  const RankTrace trace = tracer->take_trace();

  // Busy time by the phase intervals, over the traced steps: the compute stream's
  // forward, backward and optimizer spans, and the union of the comm stream's collectives.
  double compute_phases_s = 0.0, comm_phases_s = 0.0;
  for (const StepRecord& record : kept.records) {
    if (!record.traced) continue;
    for (Phase phase : {Phase::forward, Phase::backward, Phase::optimizer})
      compute_phases_s += record.intervals[static_cast<int>(phase)].length();
    std::vector<Span> spans;
    for (const CollectiveRecord& c : record.collectives) spans.push_back({c.begin_s, c.end_s});
    comm_phases_s += union_length(spans);
  }

  std::map<std::string, double> busy_s;  // by stream name
  int nccl_kernels = 0;
  for (const TraceRecord& record : trace.records) {
    const std::string& stream = trace.stream_names.at(static_cast<size_t>(record.stream));
    const std::string& name = trace.names.at(static_cast<size_t>(record.name));
    busy_s[stream] += static_cast<double>(record.end_ns - record.start_ns) * 1e-9;
    if (name.find("nccl") != std::string::npos) {
      ++nccl_kernels;
      EXPECT_EQ(record.category, KernelCategory::communication) << name;
      EXPECT_EQ(stream, "comm") << name;
    }
    if (name.find("scalestudy::") != std::string::npos) {
      EXPECT_NE(record.category, KernelCategory::other) << name;
    }
  }
  EXPECT_GT(nccl_kernels, 0) << "no NCCL kernel was traced";
  for (const auto& [stream, seconds] : busy_s)
    std::printf("rank %d: stream %-12s kernels+copies %.3f ms\n", where.rank, stream.c_str(), seconds * 1e3);
  std::printf("rank %d: phases: compute %.3f ms, comm %.3f ms; kernels/phases: compute %.4f, comm %.4f\n",
              where.rank, compute_phases_s * 1e3, comm_phases_s * 1e3, busy_s["compute"] / compute_phases_s,
              busy_s["comm"] / comm_phases_s);
  // What the traced kernels, copies and sets leave of a phase's interval is the launch gaps
  // between kernels and a step's few host round trips (the loss and the gradient norm are
  // read back): under 5 % of it while the step is compute-bound. Tracing adds host time to
  // every launch, so a step of short kernels turns launch-bound and its phases fill with
  // idle gaps that no kernel accounts for: batch 16 (profile_config) keeps every kernel
  // long enough against that host time. A collective's interval starts no earlier than
  // its enqueue (nccl_communicator.h), so the comm stream's idle wait for the host is not
  // in it either.
  EXPECT_NEAR(busy_s["compute"] / compute_phases_s, 1.0, kBusyTolerance);
  EXPECT_NEAR(busy_s["comm"] / comm_phases_s, 1.0, kBusyTolerance);
}

}  // namespace
}  // namespace scalestudy
