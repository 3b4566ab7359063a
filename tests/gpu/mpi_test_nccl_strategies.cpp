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

bool have_two_gpus() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const int visible = cuda_device_count();
  int local_ok = visible >= 1 ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return world == 2 && all_ok == 1;
}

RunConfig make_config(const std::string& backend, const std::string& strategy, const std::string& overlap) {
  const std::vector<std::string> args = {"train", "--model", "tiny", "--layers", "3", "--hidden", "64",
                                         "--heads", "4", "--vocab", "128", "--seq", "32", "--global-batch", "8",
                                         "--steps", std::to_string(kSteps), "--warmup-steps", "0",
                                         "--strategy", strategy, "--overlap", overlap, "--bucket-mb", "0.05",
                                         "--backend", backend, "--check-every", "1", "--lr", "1e-3"};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  RunConfig config;
  EXPECT_TRUE(parse_train_config(static_cast<int>(argv.size()), argv.data(), config));
  return config;
}

std::vector<float> train_on_gpus(const std::string& strategy, const std::string& overlap) {
  const ProcessPlacement where = discover_placement(MPI_COMM_WORLD);
  CudaOps ops(where.local_rank);
  NcclCommunicator comm(MPI_COMM_WORLD, ops.stream(), 120.0);
  Trainer trainer(make_config("cuda", strategy, overlap), ops, comm, MPI_COMM_WORLD);
  trainer.run(nullptr);
  return trainer.parameters_on_host();
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
  const std::vector<float> ddp = train_on_gpus("ddp", "off");
  expect_close(ddp, cpu_reference(), kCpuRtol, kCpuAtol, "ddp on 2 GPUs against the CPU");
  for (const auto& [strategy, overlap] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "on"}, {"zero2", "off"}, {"zero2", "on"}}) {
    const std::vector<float> params = train_on_gpus(strategy, overlap);
    expect_close(params, ddp, kStrategyRtol, kStrategyAtol, strategy + " overlap " + overlap + " against ddp");
  }
}

}  // namespace
}  // namespace scalestudy
