// The memory preflight's estimate against a run on one GPU, in fp32, bf16 and fp16, ddp and
// zero2, with the fused and the cuBLAS attention and with recomputation: every kind the
// CUDA backend accounts (and the NCCL communicator's bf16 staging) stays within the
// estimate of that kind, the estimate is within kMostEstimatePerHeldByte of the whole, and
// the device's own use (cudaMemGetInfo) grows by no more than the estimate with its
// head-room, which is what the preflight compares with the free memory.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "comm/nccl_communicator.h"
#include "memory_tracking.h"
#include "train/trainer.h"
#include "train_args.h"

namespace scalestudy {
namespace {

// The estimate exceeds what a run holds by the bounds of the buffers that grow: the ops'
// scratch (at most kScratchGrowth = 1.5 times the largest request, and the largest request
// is what the estimate takes) and zero2's pools (the buckets that could be in flight and
// held). Beside the parameters, optimizer state and activations these are small; 1.25
// keeps room for them and fails a term counted twice or a kind the estimate doubles.
constexpr double kMostEstimatePerHeldByte = 1.25;

struct GpuCase {
  const char* name;
  std::vector<std::string> options;
};

std::vector<GpuCase> cases() {
  // Head size 64: the fused attention in bf16 and fp16; head size 32: the cuBLAS path, which
  // keeps the probabilities and takes them as scratch.
  const std::vector<std::string> model = {"--model", "tiny", "--layers", "4", "--hidden", "512", "--vocab", "8192",
                                          "--max-seq", "256", "--seq", "256", "--batch-per-rank", "8",
                                          "--steps", "3", "--backend", "cuda", "--bucket-mb", "4"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> options = model;
    options.insert(options.end(), extra.begin(), extra.end());
    return options;
  };
  return {
      {"fp32 ddp, cuBLAS attention", with({"--precision", "fp32", "--heads", "8"})},
      {"bf16 ddp, fused attention", with({"--precision", "bf16", "--heads", "8"})},
      {"bf16 ddp overlap, bf16 gradients", with({"--precision", "bf16", "--heads", "8", "--overlap", "on",
                                                 "--grad-reduce", "bf16"})},
      {"bf16 zero2 overlap, cuBLAS attention", with({"--precision", "bf16", "--heads", "16", "--strategy",
                                                     "zero2", "--overlap", "on"})},
      {"fp16 zero2, recompute, 2 micro-batches", with({"--precision", "fp16", "--heads", "8", "--strategy", "zero2",
                                                       "--recompute", "on", "--grad-accum", "2",
                                                       "--grad-reduce", "bf16"})},
      {"fp32 zero2 overlap, recompute", with({"--precision", "fp32", "--heads", "8", "--strategy", "zero2",
                                              "--overlap", "on", "--recompute", "on"})},
  };
}

size_t device_used_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  return total_bytes - free_bytes;
}

TEST(GpuMemoryEstimate, BoundsWhatTheRunHoldsAndWhatTheDeviceUses) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
  std::printf("device: %s\n", cuda_device_description(0).c_str());
  std::printf("%-40s %12s %12s %12s %12s\n", "case", "estimate", "held", "needed", "device grew");
  for (const GpuCase& c : cases()) {
    const RunConfig config = parse_train_options(c.options);
    CudaOps ops(0, config.precision, config.gemm_algos);
    NcclCommunicator comm(MPI_COMM_WORLD, ops.stream(), 120.0);
    TrainingSetup setup = prepare_training(config, ops, comm, MPI_COMM_WORLD);
    const MemoryPreflight preflight = setup.memory;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const size_t used_before = device_used_bytes();
    size_t held = 0;
    {
      Trainer trainer(std::move(setup), ops, comm, MPI_COMM_WORLD);
      trainer.run(nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      // No buffer is released before the run ends, so each kind holds its most now.
      for (int k = 0; k < kMemoryKindCount; ++k) {
        const MemoryKind kind = static_cast<MemoryKind>(k);
        const size_t kind_held =
            ops.allocated_bytes(kind) + (kind == MemoryKind::communication ? comm.staging_bytes() : 0);
        EXPECT_LE(kind_held, preflight.estimate[kind]) << c.name << ": " << memory_kind_name(kind);
        held += kind_held;
      }
    }
    const size_t grew = ops.measured_peak_bytes() - used_before;
    std::printf("%-40s %12zu %12zu %12zu %12zu\n", c.name, preflight.estimate.total_bytes(), held,
                preflight.needed_bytes(), grew);
    EXPECT_LE(static_cast<double>(preflight.estimate.total_bytes()), kMostEstimatePerHeldByte * static_cast<double>(held))
        << c.name;
    // What the preflight compares with the free memory covers what the device then gave:
    // the estimate's buffers, and in its head-room cuBLAS's workspaces, the kernels
    // loaded on first use and NCCL's buffers.
    EXPECT_LE(grew, preflight.needed_bytes()) << c.name;
  }
}

}  // namespace
}  // namespace scalestudy
