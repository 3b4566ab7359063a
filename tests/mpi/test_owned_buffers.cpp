// Strategies run their collectives on buffers the communicator owns when it offers them
// (the NCCL communicator does with --comm-engine copy): the training is the same bit for
// bit, every owned buffer is released, and the memory report counts them under their
// kind. Run by ctest at 1, 2, 3 and 4 ranks, on the MPI communicator with an owner of
// host buffers around it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "config/run_config.h"
#include "forwarding_communicator.h"
#include "train/trainer.h"
#include "train_args.h"

namespace scalestudy {
namespace {

// Every collective goes to `inner`; the buffers it is offered come from here, filled
// with NaN, since their contents start undefined and a strategy must not rely on them.
class OwningCommunicator final : public ForwardingCommunicator {
 public:
  explicit OwningCommunicator(Communicator& inner) : ForwardingCommunicator(inner) {}

  float* allocate_owned_buffer(size_t elems, MemoryKind kind) override {
    auto buffer = std::make_unique<float[]>(elems);
    std::fill(buffer.get(), buffer.get() + elems, std::numeric_limits<float>::quiet_NaN());
    float* address = buffer.get();
    owned_[address] = Owned{std::move(buffer), elems, kind};
    ++allocations_;
    return address;
  }
  bool release_owned_buffer(float* buffer) override { return owned_.erase(buffer) == 1; }
  size_t owned_bytes(MemoryKind kind) const override {
    size_t bytes = 0;
    for (const auto& [address, owned] : owned_)
      if (owned.kind == kind) bytes += owned.elems * sizeof(float);
    return bytes;
  }

  size_t allocations() const { return allocations_; }
  size_t live_buffers() const { return owned_.size(); }

 private:
  struct Owned {
    std::unique_ptr<float[]> memory;
    size_t elems = 0;
    MemoryKind kind = MemoryKind::other;
  };
  std::map<float*, Owned> owned_;
  size_t allocations_ = 0;
};

RunConfig make_config(const std::string& strategy, const std::string& overlap) {
  const std::vector<std::string> args = {"--model", "tiny", "--layers", "2", "--seq", "16",
                                         "--global-batch", "24", "--steps", "4", "--warmup-steps", "0",
                                         "--strategy", strategy, "--overlap", overlap, "--grad-accum", "2",
                                         "--bucket-mb", "0.01", "--lr", "1e-3"};
  return parse_train_options(args);
}

struct Trained {
  std::vector<float> params;
  MemoryReport memory;
};

Trained train(const RunConfig& config, Communicator& comm, CpuOps& ops) {
  Trainer trainer(config, ops, comm, MPI_COMM_WORLD);
  trainer.run(nullptr);
  return {trainer.parameters_on_host(), trainer.memory()};
}

TEST(OwnedBuffers, StrategiesTrainTheSameOnBuffersTheCommunicatorOwns) {
  for (const char* strategy : {"ddp", "zero2"}) {
    for (const char* overlap : {"off", "on"}) {
      const std::string label = std::string(strategy) + "+overlap " + overlap;
      const RunConfig config = make_config(strategy, overlap);
      MpiCommunicator mpi(MPI_COMM_WORLD, 120.0);
      CpuOps plain_ops;
      const Trained plain = train(config, mpi, plain_ops);
      OwningCommunicator owning(mpi);
      CpuOps owned_ops;
      const Trained owned = train(config, owning, owned_ops);

      ASSERT_EQ(owned.params.size(), plain.params.size());
      size_t differing = 0;
      for (size_t i = 0; i < plain.params.size(); ++i) differing += owned.params[i] != plain.params[i];
      EXPECT_EQ(differing, 0u) << label << ": parameters that differ";
      EXPECT_GT(owning.allocations(), 0u) << label << ": the strategy never asked for an owned buffer";
      EXPECT_EQ(owning.live_buffers(), 0u) << label << ": owned buffers not released";
      for (int k = 0; k < kMemoryKindCount; ++k)
        EXPECT_EQ(owned.memory.bytes[k], plain.memory.bytes[k])
            << label << ": memory report of " << memory_kind_name(static_cast<MemoryKind>(k));
    }
  }
}

}  // namespace
}  // namespace scalestudy
