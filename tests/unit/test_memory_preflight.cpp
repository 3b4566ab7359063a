// The memory preflight's estimate against what the run's constructors allocate on the CPU
// backend, kind by kind and to the byte, for ddp and zero2 at 1 to 4 ranks, with and
// without recomputation; the refusal and its suggestions; and allocations that fail.
#include <gtest/gtest.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "core/memory_estimate.h"
#include "core/usage_error.h"
#include "forwarding_communicator.h"
#include "memory_tracking.h"
#include "model/gpt.h"
#include "parallel/strategy.h"
#include "train/memory_preflight.h"
#include "train/trainer.h"
#include "training.h"

namespace scalestudy {
namespace {

// A communicator that says it is rank `rank` of `world`: the constructors only size their
// buffers by it, so one process sees every rank's allocations.
class PretendWorld : public ForwardingCommunicator {
 public:
  PretendWorld(Communicator& inner, int world, int rank) : ForwardingCommunicator(inner), world_(world), rank_(rank) {}
  int world_size() const override { return world_; }
  int rank() const override { return rank_; }

 private:
  int world_, rank_;
};

struct EstimateCase {
  const char* name;
  ModelShape shape;
  int micro_batch, seq;
};

// tiny, and a shape with no size a multiple of a chunk (odd vocab and sequence).
const EstimateCase kCases[] = {
    {"tiny", {2, 32, 4, 64, 64, true}, 3, 64},
    {"odd", {3, 48, 4, 101, 40, false}, 2, 37},
};

TEST(MemoryEstimate, ParameterGradientOptimizerAndActivationTermsAreWhatTheConstructorsAllocate) {
  MpiCommunicator self(MPI_COMM_SELF, 120.0);
  for (const EstimateCase& c : kCases)
    for (Strategy strategy : {Strategy::ddp, Strategy::zero2})
      for (int world : {1, 2, 3, 4})
        for (bool recompute : {false, true}) {
          const std::string label = std::string(c.name) + " " + strategy_name(strategy) + " on " +
                                    std::to_string(world) + " ranks" + (recompute ? ", recompute" : "");
          CpuOps ops;
          PretendWorld comm(self, world, world - 1);
          DataParallelConfig parallel;
          parallel.strategy = strategy;
          parallel.bucket_bytes = 4096;  // many buckets, some across tensors' edges
          const ParameterLayout layout = make_parameter_layout(c.shape);
          const BucketPlan plan = make_bucket_plan(layout.param_elems, parallel.bucket_bytes, world,
                                                   layout.segments[layout.embedding_segment()].end_elems);
          ASSERT_GT(plan.buckets.size(), 4u) << label;
          const MemoryEstimate estimate = estimate_training_memory(
              {.strategy = {parallel, ops, comm, plan, layout, 1}, .shape = c.shape,
               .micro_batch = c.micro_batch, .seq = c.seq, .recompute = recompute});
          Gpt model(ops, c.shape, c.micro_batch, c.seq, plan.padded_elems, recompute);
          const std::unique_ptr<GradientStrategy> gradients = make_strategy(parallel, ops, comm, model, plan);
          for (MemoryKind kind : {MemoryKind::parameters, MemoryKind::gradients, MemoryKind::optimizer,
                                  MemoryKind::activations, MemoryKind::other})
            EXPECT_EQ(estimate[kind], ops.allocated_bytes(kind)) << label << ": " << memory_kind_name(kind);
          // Nothing is staged before the first backward; zero2's pools then grow to at most
          // the estimate (tests/mpi/test_memory_estimate.cpp).
          EXPECT_EQ(ops.allocated_bytes(MemoryKind::communication), 0u) << label;
          if (strategy == Strategy::ddp) {
            EXPECT_EQ(estimate[MemoryKind::communication], 0u) << label << ": fp32 allreduces stage nothing";
          } else {
            EXPECT_GT(estimate[MemoryKind::communication], 0u) << label << ": zero2 stages its buckets";
          }
        }
}

// Recomputation keeps one block's buffers for all blocks and each block's output: with L
// layers it saves L - 1 times a block's buffers less its output, exactly.
TEST(MemoryEstimate, RecomputationKeepsOneBlockOfActivations) {
  CpuOps ops;
  const int batch = 2, seq = 16;
  const auto activations = [&](int layers, bool recompute) {
    const ModelShape shape{layers, 32, 4, 64, 16, true};
    return Gpt::activation_bytes(ops, shape, batch, seq, recompute);
  };
  const size_t block_bytes = activations(2, false) - activations(1, false);
  const size_t block_output_bytes = static_cast<size_t>(batch) * seq * 32 * sizeof(float);
  EXPECT_EQ(activations(1, true), activations(1, false)) << "one block has nothing to share";
  for (int layers : {2, 3, 6}) {
    EXPECT_LT(activations(layers, true), activations(layers, false)) << layers << " layers";
    EXPECT_EQ(activations(layers, false) - activations(layers, true),
              static_cast<size_t>(layers - 1) * (block_bytes - block_output_bytes))
        << layers << " layers";
  }
}

// A CPU backend that reports as much memory available as the test says.
class LimitedCpuOps : public CpuOps {
 public:
  explicit LimitedCpuOps(size_t available_bytes) : available_bytes_(available_bytes) {}
  size_t available_bytes() const override { return available_bytes_; }

 private:
  size_t available_bytes_;
};

// What the run of `options` needs with another split and recomputation: the bytes that
// must fit in the memory available for it to run.
size_t needed_bytes(const std::vector<std::string>& options, int grad_accum, bool recompute) {
  RunConfig config = parse_train_options(options);
  resolve_for_world(config, 1);
  CpuOps ops;
  MpiCommunicator self(MPI_COMM_SELF, 120.0);
  const DataParallelConfig parallel = config.data_parallel();
  const ParameterLayout layout = make_parameter_layout(config.shape);
  const BucketPlan plan = make_bucket_plan(layout.param_elems, parallel.bucket_bytes, 1,
                                           layout.segments[layout.embedding_segment()].end_elems);
  const MemoryEstimate estimate = estimate_training_memory(
      {.strategy = {parallel, ops, self, plan, layout, grad_accum}, .shape = config.shape,
       .micro_batch = config.batch_per_rank / grad_accum, .seq = config.seq, .recompute = recompute});
  return memory_with_headroom(estimate.total_bytes());
}

// The refusal of `options` with `available_bytes` available, or "" when the run fits.
std::string refusal(const std::vector<std::string>& options, size_t available_bytes) {
  LimitedCpuOps ops(available_bytes);
  MpiCommunicator self(MPI_COMM_SELF, 120.0);
  try {
    const TrainingSetup setup = prepare_training(parse_train_options(options), ops, self, MPI_COMM_SELF);
    EXPECT_LE(setup.memory.needed_bytes(), available_bytes);
    return "";
  } catch (const UsageError& error) {
    return error.what();
  }
}

TEST(MemoryPreflight, RefusesARunThatDoesNotFitAndSaysWhatWould) {
  const std::vector<std::string> run = {"--model", "gpt2-small", "--global-batch", "64", "--seq", "256"};
  const size_t as_given = needed_bytes(run, 1, false);
  EXPECT_EQ(refusal(run, as_given), "") << "exactly enough memory fits";

  const std::string short_by_one = refusal(run, as_given - 1);
  for (const char* part : {"--global-batch 64: model gpt2-small needs ", "available", "rank 0"})
    EXPECT_NE(short_by_one.find(part), std::string::npos) << short_by_one;
  EXPECT_NE(short_by_one.find("it fits with --recompute on"), std::string::npos) << short_by_one;

  // Enough for 8 sequences at a time and not 16: --grad-accum 8 (64 / 8) is the fewest
  // micro-batches that fit, and with recomputation fewer do.
  const size_t eight_sequences = needed_bytes(run, 8, false);
  ASSERT_GT(needed_bytes(run, 4, false), eight_sequences);
  ASSERT_GT(needed_bytes(run, 1, true), eight_sequences) << "the case needs recomputation not to fit whole";
  const std::string split = refusal(run, eight_sequences);
  EXPECT_NE(split.find("it fits with --grad-accum 8, or with --recompute on --grad-accum "), std::string::npos)
      << split;

  const std::string hopeless = refusal(run, 1000);
  EXPECT_NE(hopeless.find("even one sequence per micro-batch with --recompute on (--grad-accum 64) needs"),
            std::string::npos)
      << hopeless;

  const std::string weak = refusal({"--model", "gpt2-small", "--batch-per-rank", "2"}, 1000);
  EXPECT_EQ(weak.rfind("--batch-per-rank 2: model gpt2-small needs ", 0), 0u) << weak;
}

TEST(MemoryPreflight, RefusesAMicroBatchWithMoreRowsThanTheOpsCount) {
  const std::string refused =
      refusal({"--model", "tiny", "--global-batch", std::to_string(INT_MAX / 64 + 1)}, SIZE_MAX / 4);
  EXPECT_NE(refused.find("more rows than the ops count"), std::string::npos) << refused;
}

TEST(OutOfMemory, TheCpuBackendThrowsNamingTheKind) {
  CpuOps ops;
  try {
    (void)ops.allocate_floats(SIZE_MAX / 8, MemoryKind::activations);
    FAIL() << "an allocation of half the address space succeeded";
  } catch (const OutOfMemoryError& error) {
    EXPECT_EQ(error.kind(), MemoryKind::activations);
    EXPECT_EQ(std::string(error.what()).rfind("out of memory while allocating activations (", 0), 0u) << error.what();
  }
  EXPECT_EQ(accounted_bytes(ops), 0u);
}

// A CPU backend whose activations run out after `allowed` of them.
class ExhaustibleCpuOps : public CpuOps {
 public:
  explicit ExhaustibleCpuOps(int allowed) : allowed_(allowed) {}
  float* allocate_floats(size_t elems, MemoryKind kind) override {
    if (kind == MemoryKind::activations && allowed_-- <= 0) throw OutOfMemoryError(kind, elems * 4, "test backend");
    return CpuOps::allocate_floats(elems, kind);
  }

 private:
  int allowed_;
};

TEST(OutOfMemory, AModelThatCannotAllocateReleasesWhatItHad) {
  const ModelShape shape{3, 32, 4, 64, 16, true};
  for (int allowed : {0, 5, 30}) {
    ExhaustibleCpuOps ops(allowed);
    EXPECT_THROW(Gpt(ops, shape, 2, 16, make_parameter_layout(shape).param_elems), OutOfMemoryError) << allowed;
    EXPECT_EQ(accounted_bytes(ops), 0u) << allowed << " activations allocated before the failure";
  }
}

}  // namespace
}  // namespace scalestudy
