// The parts of the kernel profile that need no GPU: the category rules, the summary and
// tracing cost with traced steps, and the /kernel_trace writer read back through HDF5.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "results/hdf5_check.h"
#include "profile/kernel_category.h"
#include "profile/kernel_trace.h"
#include "results/hdf5_io.h"
#include "results/kernel_trace_writer.h"
#include "results/run_summary.h"

namespace scalestudy {
namespace {

constexpr LaunchTag kUntagged{};
LaunchTag tagged(KernelCategory category) { return {true, category}; }

TEST(KernelCategory, RulesApplyInOrder) {
  // Copies and sets are memory whatever they are called or tagged.
  EXPECT_EQ(categorize(TraceRecordKind::memcpy, "memcpy HtoD", tagged(KernelCategory::gemm)), KernelCategory::memory);
  EXPECT_EQ(categorize(TraceRecordKind::memset, "memset", kUntagged), KernelCategory::memory);
  // NCCL's kernels are communication even when launched inside a tagged op.
  EXPECT_EQ(categorize(TraceRecordKind::kernel, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                       tagged(KernelCategory::optimizer)),
            KernelCategory::communication);
  // cuBLAS kernels are gemm before any tag, so attention's GEMMs count as GEMMs.
  for (const char* name : {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1",
                           "nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NTN", "void cutlass::Kernel2<cutlass_80_wmma>(T1::Params)",
                           "void gemv2T_kernel_val<int, int, float>()", "void splitKreduce_kernel<32, 16>()"})
    EXPECT_EQ(categorize(TraceRecordKind::kernel, name, tagged(KernelCategory::attention)), KernelCategory::gemm) << name;
  // scalestudy's kernels carry their op's tag; without one a kernel is other.
  const std::string own = "void scalestudy::cuda::(anonymous namespace)::layernorm_forward_kernel<float>(LayerNormForwardParams<float>)";
  EXPECT_EQ(categorize(TraceRecordKind::kernel, own, tagged(KernelCategory::norm_elementwise)),
            KernelCategory::norm_elementwise);
  EXPECT_EQ(categorize(TraceRecordKind::kernel, own, kUntagged), KernelCategory::other);
  EXPECT_EQ(categorize(TraceRecordKind::kernel, "attention_softmax_kernel", tagged(KernelCategory::attention)),
            KernelCategory::attention);
}

TEST(KernelCategory, NamesAndRulesAreComplete) {
  const auto names = kernel_category_names();
  ASSERT_EQ(names.size(), static_cast<size_t>(kKernelCategoryCount));
  EXPECT_EQ(names.front(), "gemm");
  EXPECT_EQ(names.back(), "other");
  EXPECT_EQ(trace_record_kind_names(), (std::vector<std::string>{"kernel", "memcpy", "memset"}));
  const auto rules = kernel_category_rules();
  ASSERT_EQ(rules.size(), 5u);
  EXPECT_NE(rules[1].find("'nccl'"), std::string::npos);
  EXPECT_NE(rules[2].find("'nvjet'"), std::string::npos);
}

GatheredStep one_rank_step(int64_t index, double seconds, bool warmup, bool traced) {
  GatheredStep step;
  step.step_index = index;
  step.warmup = warmup;
  step.traced = traced;
  step.tokens = 1000;
  PhaseIntervals intervals;
  for (Interval& interval : intervals) interval = {std::nan(""), std::nan("")};
  intervals[static_cast<int>(Phase::step)] = {0.0, seconds};
  intervals[static_cast<int>(Phase::forward)] = {0.0, seconds};
  step.intervals.push_back(intervals);
  step.collectives.emplace_back();
  return step;
}

TEST(KernelProfileSummary, TracedStepsAreLeftOutAndTheirCostMeasured) {
  // Steps of 1 s, a warm-up of 9 s and traced steps of 1.5 s and 2.5 s: the summary sees
  // only the four 1 s steps; tracing costs (1.5 + 2.5) / 2 = 2 s against a 1 s median.
  std::vector<GatheredStep> steps = {one_rank_step(0, 9.0, true, false), one_rank_step(1, 1.0, false, false),
                                     one_rank_step(2, 1.5, false, true),  one_rank_step(3, 2.5, false, true),
                                     one_rank_step(4, 1.0, false, false), one_rank_step(5, 1.0, false, false),
                                     one_rank_step(6, 1.0, false, false)};
  const RunSummary summary = summarize(steps, 1, 1e12, std::nan(""), "none");
  EXPECT_EQ(summary.steps_measured, 4);
  EXPECT_DOUBLE_EQ(summary.step_time_median_s, 1.0);
  EXPECT_DOUBLE_EQ(summary.step_time_q3_s, 1.0);
  const TracingCost cost = tracing_cost(steps);
  EXPECT_DOUBLE_EQ(cost.traced_step_time_mean_s, 2.0);
  EXPECT_DOUBLE_EQ(cost.untraced_step_time_median_s, 1.0);
  steps.resize(4);  // no untraced measured step after the window
  steps.erase(steps.begin() + 1);
  EXPECT_TRUE(std::isnan(tracing_cost(steps).untraced_step_time_median_s));
}

template <class T>
std::vector<T> read_dataset(hid_t group, const char* name, hid_t type, size_t elems) {
  std::vector<T> values(elems);
  h5::Handle dataset(CHECK_HDF5(H5Dopen2(group, name, H5P_DEFAULT)));
  if (elems > 0) CHECK_HDF5(H5Dread(dataset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
  return values;
}

double read_double_attribute(hid_t object, const char* name) {
  double value = 0.0;
  h5::Handle attribute(CHECK_HDF5(H5Aopen(object, name, H5P_DEFAULT)));
  CHECK_HDF5(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value));
  return value;
}

TEST(KernelTraceWriter, WritesEveryRankAndReadsBack) {
  RankTrace rank0;
  rank0.device = "GPU 0";
  rank0.origin_ns = 123456789;
  rank0.names = {"gemm_kernel", "memcpy HtoD"};
  rank0.stream_names = {"compute", "stream 7"};
  const TraceRecord kernel{.step = 5, .start_ns = 100, .end_ns = 350, .name = 0, .stream = 0, .grid = {4, 2, 1},
                           .block = {128, 1, 1}, .category = KernelCategory::gemm};
  const TraceRecord copy{.step = 6, .start_ns = 400, .end_ns = 420, .bytes = 4096, .name = 1, .stream = 1,
                         .kind = TraceRecordKind::memcpy, .category = KernelCategory::memory};
  rank0.records = {kernel, copy};
  RankTrace rank1;  // a rank that recorded nothing still gets its group
  rank1.device = "GPU 1";

  const std::string path = "/tmp/scalestudy_kernel_trace_" + std::to_string(getpid()) + ".h5";
  {
    h5::Handle file(CHECK_HDF5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)));
    KernelTraceWindow window;
    window.first = 5;
    window.last = 6;
    window.traced_step_time_mean_s = 0.03;
    window.untraced_step_time_median_s = 0.025;
    write_kernel_trace(file.get(), {rank0, rank1}, window);
  }
  h5::Handle file(CHECK_HDF5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)));
  h5::Handle trace(CHECK_HDF5(H5Gopen2(file.get(), "kernel_trace", H5P_DEFAULT)));
  EXPECT_NEAR(read_double_attribute(trace.get(), "tracing_overhead"), 0.2, 1e-12);  // 0.03 / 0.025 - 1
  h5::Handle group0(CHECK_HDF5(H5Gopen2(trace.get(), "rank_0", H5P_DEFAULT)));
  EXPECT_EQ(read_dataset<int64_t>(group0.get(), "step", H5T_NATIVE_INT64, 2), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(read_dataset<int64_t>(group0.get(), "start_ns", H5T_NATIVE_INT64, 2), (std::vector<int64_t>{100, 400}));
  EXPECT_EQ(read_dataset<int64_t>(group0.get(), "end_ns", H5T_NATIVE_INT64, 2), (std::vector<int64_t>{350, 420}));
  EXPECT_EQ(read_dataset<int64_t>(group0.get(), "bytes", H5T_NATIVE_INT64, 2), (std::vector<int64_t>{0, 4096}));
  EXPECT_EQ(read_dataset<uint8_t>(group0.get(), "category", H5T_NATIVE_UINT8, 2),
            (std::vector<uint8_t>{static_cast<uint8_t>(KernelCategory::gemm), static_cast<uint8_t>(KernelCategory::memory)}));
  EXPECT_EQ(read_dataset<uint8_t>(group0.get(), "kind", H5T_NATIVE_UINT8, 2), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(read_dataset<int32_t>(group0.get(), "grid", H5T_NATIVE_INT32, 6), (std::vector<int32_t>{4, 2, 1, 0, 0, 0}));
  EXPECT_EQ(read_dataset<int32_t>(group0.get(), "stream", H5T_NATIVE_INT32, 2), (std::vector<int32_t>{0, 1}));
  h5::Handle group1(CHECK_HDF5(H5Gopen2(trace.get(), "rank_1", H5P_DEFAULT)));
  h5::Handle empty(CHECK_HDF5(H5Dopen2(group1.get(), "start_ns", H5P_DEFAULT)));
  h5::Handle space(CHECK_HDF5(H5Dget_space(empty.get())));
  EXPECT_EQ(H5Sget_simple_extent_npoints(space.get()), 0);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace scalestudy
