// On 2 GPUs: ddp, ddp+overlap, zero2 and zero2+overlap over NCCL train the same model as
// each other and as the one-rank CPU reference.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl_communicator.h"
#include "config/run_config.h"
#include "train/trainer.h"

namespace scalestudy {
namespace {

constexpr int kSteps = 5;
// Strategies against each other on the GPUs: the same kernels, NCCL sums in different
// orders (allreduce against reduce-scatter), so only the last bits differ, as on the CPU.
constexpr double kStrategyRtol = 1e-5, kStrategyAtol = 1e-6;
// GPU against the CPU reference: cuBLAS and the CPU add the dot products in different
// orders (~1e-6 relative per op); five AdamW steps carry that through as ~lr*1e-3.
constexpr double kCpuRtol = 1e-3, kCpuAtol = 1e-5;
// bf16 compute: a last-bit difference in a master weight can flip its bf16 copy by one
// ulp (2^-8 relative), so runs differ per element by up to a few AdamW steps of lr.
// The updates must still agree as vectors: ||Δ_a - Δ_b|| / ||Δ_b|| (Δ = params - initial
// params) is at most kBf16UpdateTolerance, between strategies and against the fp32 CPU.
constexpr double kBf16StrategyUpdateTolerance = 2e-2;
constexpr double kBf16CpuUpdateTolerance = 1e-1;

bool have_two_gpus() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int visible = cuda_device_count();
  int local_ok = visible >= 1 ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return world == 2 && all_ok == 1;
}

RunConfig make_config(const std::string& backend, const std::string& strategy, const std::string& overlap,
                      const std::string& precision = "fp32") {
  const std::vector<std::string> args = {"train", "--model", "tiny", "--layers", "3", "--hidden", "64",
                                         "--heads", "4", "--vocab", "128", "--seq", "32", "--global-batch", "8",
                                         "--steps", std::to_string(kSteps), "--warmup-steps", "0",
                                         "--strategy", strategy, "--overlap", overlap, "--bucket-mb", "0.05",
                                         "--backend", backend, "--check-every", "1", "--lr", "1e-3",
                                         "--precision", precision};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  RunConfig config;
  EXPECT_TRUE(parse_train_config(static_cast<int>(argv.size()), argv.data(), config));
  return config;
}

struct GpuRun {
  std::vector<float> initial, final;
};

GpuRun train_on_gpus(const std::string& strategy, const std::string& overlap, Precision precision = Precision::fp32) {
  const ProcessPlacement where = discover_placement(MPI_COMM_WORLD);
  CudaOps ops(where.local_rank, precision);
  NcclCommunicator comm(MPI_COMM_WORLD, ops.stream(), 120.0);
  Trainer trainer(make_config("cuda", strategy, overlap, precision_name(precision)), ops, comm, MPI_COMM_WORLD);
  GpuRun run;
  run.initial = trainer.parameters_on_host();
  trainer.run(nullptr);
  run.final = trainer.parameters_on_host();
  return run;
}

// ||(a - initial) - (b - initial)|| / ||b - initial||
double update_difference(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& initial) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double da = static_cast<double>(a[i]) - initial[i], db = static_cast<double>(b[i]) - initial[i];
    diff += (da - db) * (da - db);
    norm += db * db;
  }
  return std::sqrt(diff / norm);
}

const std::vector<float>& cpu_reference() {
  static const std::vector<float> reference = [] {
    CpuOps ops;
    MpiCommunicator comm(MPI_COMM_SELF, 120.0);
    Trainer trainer(make_config("cpu", "ddp", "off"), ops, comm, MPI_COMM_SELF);
    trainer.run(nullptr);
    return trainer.parameters_on_host();
  }();
  return reference;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(static_cast<double>(got[i]) - ref[i]) > atol + rtol * std::fabs(ref[i]) || std::isnan(got[i])) {
      if (mismatches++ == 0)
        ADD_FAILURE() << what << ": first mismatch at parameter " << i << ": " << got[i] << " vs " << ref[i];
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

TEST(NcclStrategies, AllStrategiesAgreeWithEachOtherAndWithTheCpu) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const std::vector<float> ddp = train_on_gpus("ddp", "off").final;
  expect_close(ddp, cpu_reference(), kCpuRtol, kCpuAtol, "ddp on 2 GPUs against the CPU");
  for (const auto& [strategy, overlap] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "on"}, {"zero2", "off"}, {"zero2", "on"}}) {
    const std::vector<float> params = train_on_gpus(strategy, overlap).final;
    expect_close(params, ddp, kStrategyRtol, kStrategyAtol, strategy + " overlap " + overlap + " against ddp");
  }
}

TEST(NcclStrategies, Bf16StrategiesAgreeWithEachOtherAndWithTheCpu) {
  if (!have_two_gpus()) GTEST_SKIP() << "needs 2 ranks with a visible GPU each: multi-GPU tests skipped";
  const GpuRun ddp = train_on_gpus("ddp", "off", Precision::bf16);
  ASSERT_EQ(ddp.initial.size(), cpu_reference().size());
  const double against_cpu = update_difference(ddp.final, cpu_reference(), ddp.initial);
  EXPECT_LE(against_cpu, kBf16CpuUpdateTolerance) << "bf16 ddp on 2 GPUs against the fp32 CPU run";
  for (const auto& [strategy, overlap] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "on"}, {"zero2", "off"}, {"zero2", "on"}}) {
    const GpuRun run = train_on_gpus(strategy, overlap, Precision::bf16);
    const double difference = update_difference(run.final, ddp.final, ddp.initial);
    EXPECT_LE(difference, kBf16StrategyUpdateTolerance) << strategy << " overlap " << overlap << " bf16 against ddp";
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace scalestudy
