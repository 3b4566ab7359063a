// The two instruments that watch a GPU while it works, each on one GPU. The CUPTI kernel
// tracer (--profile-kernels): nothing of CUPTI is loaded until a tracer is made; a traced
// run labels every record with its step, and every record gets a category other than
// "other" (scalestudy's kernels and cuDNN's by their ops' launch tags, cuBLAS and NCCL by
// name, copies and sets as memory), in fp32, in bf16 with the flash attention and in bf16
// with cuDNN's, which launches through the driver API. The NVML sampler
// (src/backend/cuda/nvml_telemetry.h, --gpu-telemetry-ms) on GPU 0 while it multiplies
// matrices: it loads, keeps up with its period, and reads values a working GPU can have.
// ctest parts: kernel_tracer=-NvmlTelemetry.* nvml_sampler=NvmlTelemetry.*
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cupti_tracer.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/nvml_telemetry.h"
#include "comm/nccl_communicator.h"
#include "config/run_config.h"
#include "train/trainer.h"
#include "training.h"

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

TEST(NvmlTelemetry, SamplesABusyGpuAtItsPeriod) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
  CudaOps ops(0, Precision::fp32);
  constexpr int kSize = 4096;
  const size_t elems = static_cast<size_t>(kSize) * kSize;
  float* a = ops.allocate_floats(elems, MemoryKind::other);
  float* w = ops.allocate_floats(elems, MemoryKind::other);
  float* out = ops.allocate_floats(elems, MemoryKind::other);
  ops.fill_zero(a, elems);
  ops.fill_zero(w, elems);

  constexpr auto kPeriod = std::chrono::milliseconds(5);
  std::string why_not;
  const auto telemetry = make_nvml_telemetry(0, kPeriod, why_not);
  ASSERT_NE(telemetry, nullptr) << why_not;
  (void)telemetry->take_samples();  // the idle GPU before the work
  const auto begin = std::chrono::steady_clock::now();
  double elapsed_s = 0.0;
  while (elapsed_s < 0.5) {
    for (int i = 0; i < 20; ++i)
      ops.matmul_forward({.out = out, .inp = a, .weight = w, .rows = kSize, .in_channels = kSize,
                          .out_channels = kSize});
    ops.synchronize();
    elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }
  const auto end = std::chrono::steady_clock::now();
  const std::vector<GpuSample> samples = telemetry->take_samples();
  const StepGpuState busy = summarize_gpu_samples(samples);
  std::printf("NVML: %lld samples in %.3f s (period %lld ms): SM clock %.0f MHz (lowest %.0f), power %.0f W, "
              "%.0f C, power-capped %.2f, reasons 0x%llx\n",
              static_cast<long long>(busy.samples), elapsed_s, static_cast<long long>(kPeriod.count()),
              busy.sm_clock_mhz, busy.sm_clock_min_mhz, busy.power_w, busy.temperature_c, busy.power_capped,
              static_cast<unsigned long long>(busy.clock_event_reasons));
  // At most one sample per period; at least half as many, or the reads are slower than
  // the period and a step's figures rest on fewer samples than --gpu-telemetry-ms says.
  const double periods = elapsed_s / (kPeriod.count() / 1000.0);
  EXPECT_LE(busy.samples, periods + 2);
  EXPECT_GE(busy.samples, 0.5 * periods);
  // Ranges any data-centre GPU at work stays in: its SM clock, board power, temperature.
  EXPECT_GE(busy.sm_clock_min_mhz, 200.0);
  EXPECT_LE(busy.sm_clock_min_mhz, busy.sm_clock_mhz);
  EXPECT_LE(busy.sm_clock_mhz, 3000.0);
  EXPECT_GE(busy.power_w, 50.0) << "instantaneous power of a GPU multiplying fp32 matrices";
  EXPECT_LE(busy.power_w, 1500.0);
  EXPECT_GE(busy.temperature_c, 10.0);
  EXPECT_LE(busy.temperature_c, 110.0);
  EXPECT_GE(busy.power_capped, 0.0);
  EXPECT_LE(busy.power_capped, 1.0);
  EXPECT_EQ(busy.clock_event_reasons & 0x1, 0) << "the GPU was never idle while it multiplied";
  // Each sample carries the host time it was taken at, in order, on the clock the step's
  // phases are placed on; the first may predate the work by one period.
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_GE(samples[i].taken_at, begin - kPeriod) << "sample " << i;
    EXPECT_LE(samples[i].taken_at, end) << "sample " << i;
    if (i > 0) {
      EXPECT_GT(samples[i].taken_at, samples[i - 1].taken_at) << "sample " << i;
    }
  }

  // take_samples hands over what it has: right after one, at most a sample or two are in.
  EXPECT_LE(telemetry->take_samples().size(), 2u);
  for (float* p : {a, w, out}) ops.release(p);
}

}  // namespace
}  // namespace scalestudy
