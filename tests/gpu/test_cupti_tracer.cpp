// The CUPTI kernel tracer on one GPU: nothing of CUPTI is loaded until a tracer is made;
// a traced run labels every record with its step, and every record gets a category
// other than "other" (scalestudy's kernels and cuDNN's by their ops' launch tags, cuBLAS
// and NCCL by name, copies and sets as memory), in fp32, in bf16 with the flash attention
// and in bf16 with cuDNN's, which launches through the driver API.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cupti_tracer.h"
#include "backend/cuda/device_info.h"
#include "comm/nccl_communicator.h"
#include "config/run_config.h"
#include "train/trainer.h"
#include "train_args.h"

namespace scalestudy {
namespace {

constexpr int kTraceFirst = 1, kTraceLast = 2;

RunConfig small_config(const char* precision) {
  const std::vector<std::string> args = {"--model", "tiny", "--layers", "2", "--hidden", "128",
                                         "--heads", "4", "--vocab", "512", "--seq", "64", "--batch-per-rank", "4",
                                         "--steps", "4", "--warmup-steps", "1", "--backend", "cuda",
                                         "--precision", precision, "--profile-kernels", "--profile-window", "1-2"};
  return parse_train_options(args);
}

// A traced run in `mode`: "fp32", "bf16" (flash attention) or "bf16-cudnn".
RankTrace traced_run(const std::string& mode) {
  const bool cudnn = mode == "bf16-cudnn";
  const std::string precision = cudnn ? "bf16" : mode;
  CudaOps ops(0, precision == "bf16" ? Precision::bf16 : Precision::fp32, GemmAlgos::heuristic,
              cudnn ? AttentionKernel::cudnn : AttentionKernel::flash);
  NcclCommunicator comm(MPI_COMM_WORLD, ops.stream(), 120.0);
  Trainer trainer(small_config(precision.c_str()), ops, comm, MPI_COMM_WORLD);
  std::unique_ptr<KernelTracer> tracer = ops.make_kernel_tracer();
  tracer->name_stream("comm", comm.native_stream());
  trainer.set_kernel_tracer(tracer.get(), kTraceFirst, kTraceLast);
  trainer.run(nullptr);
  return tracer->take_trace();
}

class KernelProfile : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
    if (world != 1) GTEST_SKIP() << "runs on one rank";
    std::string why_not;
    if (std::string(GetParam()) == "bf16-cudnn" && !cudnn_attention_loadable(why_not))
      GTEST_SKIP() << "cuDNN's attention unavailable: " << why_not;
  }
};

// Declared first, so that it runs before any tracer exists in this process.
TEST(KernelProfileLoading, CuptiIsNotLoadedWithoutATracer) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
  CudaOps ops(0, Precision::bf16);
  NcclCommunicator comm(MPI_COMM_WORLD, ops.stream(), 120.0);
  RunConfig config = small_config("bf16");
  config.profile_kernels = false;
  Trainer trainer(config, ops, comm, MPI_COMM_WORLD);
  trainer.run(nullptr);
  EXPECT_FALSE(cupti_library_loaded()) << "a run without --profile-kernels loaded libcupti";
  std::unique_ptr<KernelTracer> tracer = ops.make_kernel_tracer();
  EXPECT_TRUE(cupti_library_loaded());
}

TEST_P(KernelProfile, EveryRecordHasAStepAndACategoryOtherThanOther) {
  const RankTrace trace = traced_run(GetParam());
  ASSERT_FALSE(trace.records.empty());
  std::map<KernelCategory, int> per_category;
  for (const TraceRecord& record : trace.records) {
    const std::string& name = trace.names.at(static_cast<size_t>(record.name));
    EXPECT_NE(record.category, KernelCategory::other) << name << " on " << trace.stream_names.at(record.stream);
    EXPECT_GE(record.step, kTraceFirst) << name;
    EXPECT_LE(record.step, kTraceLast) << name;
    EXPECT_GE(record.end_ns, record.start_ns) << name;
    EXPECT_GE(record.start_ns, 0) << name;
    if (name.find("scalestudy::") != std::string::npos) {
      EXPECT_EQ(record.kind, TraceRecordKind::kernel);
      EXPECT_NE(record.category, KernelCategory::communication) << name;
    }
    ++per_category[record.category];
  }
  for (KernelCategory expected : {KernelCategory::gemm, KernelCategory::attention, KernelCategory::norm_elementwise,
                                  KernelCategory::optimizer, KernelCategory::memory})
    EXPECT_GT(per_category[expected], 0) << kernel_category_name(expected);
  for (size_t i = 1; i < trace.records.size(); ++i)
    EXPECT_LE(trace.records[i - 1].start_ns, trace.records[i].start_ns) << "records are sorted by start";
  bool compute_named = false;
  for (const std::string& stream : trace.stream_names) compute_named |= stream == "compute";
  EXPECT_TRUE(compute_named);
}

INSTANTIATE_TEST_SUITE_P(Modes, KernelProfile, ::testing::Values("fp32", "bf16", "bf16-cudnn"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           name.erase(std::remove(name.begin(), name.end(), '-'), name.end());
                           return name;
                         });

}  // namespace
}  // namespace scalestudy
