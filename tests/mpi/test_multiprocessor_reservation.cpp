// When the strategies hold multiprocessors back for the overlapped lane's collectives
// (DeviceServices::reserve_multiprocessors): only with --overlap on, from backward's first
// overlapped bucket on, and never while forward or the optimizer runs (one micro-batch per
// step here).
// On the CPU the reservation changes nothing, so the ops here only record it; the
// communicator around the MPI one reports a lane of kLaneMultiprocessors, as the NCCL one
// does with --overlapped-ctas. Run by ctest at 1, 2, 3 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "config/run_config.h"
#include "forwarding_communicator.h"
#include "train/trainer.h"
#include "training.h"

namespace scalestudy {
namespace {

constexpr int kLaneMultiprocessors = 4;

class LaneCommunicator final : public ForwardingCommunicator {
 public:
  explicit LaneCommunicator(Communicator& inner) : ForwardingCommunicator(inner) {}
  int overlapped_lane_multiprocessors() const override { return kLaneMultiprocessors; }
};

// CpuOps that count the backward GEMMs and optimizer updates run with and without a
// reservation in force.
class ReservationRecordingOps final : public CpuOps {
 public:
  void reserve_multiprocessors(int count) override {
    reserved_ = count;
    requests.push_back(count);
  }
  void matmul_forward(const MatmulForwardArgs<float>& args) override {
    ++(reserved_ > 0 ? forward_reserved : forward_unreserved);
    CpuOps::matmul_forward(args);
  }
  void matmul_backward(const MatmulBackwardArgs<float>& args) override {
    ++(reserved_ > 0 ? backward_reserved : backward_unreserved);
    CpuOps::matmul_backward(args);
  }
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t elems,
                    const AdamWParams& hyper) override {
    ++(reserved_ > 0 ? updates_reserved : updates_unreserved);
    CpuOps::adamw_update(params, grads, m, v, elems, hyper);
  }
  int reserved() const { return reserved_; }

  std::vector<int> requests;
  int forward_reserved = 0, forward_unreserved = 0;
  int backward_reserved = 0, backward_unreserved = 0;
  int updates_reserved = 0, updates_unreserved = 0;

 private:
  int reserved_ = 0;
};

RunConfig make_config(const std::string& strategy, const std::string& overlap) {
  // Buckets of 0.01 MiB: several per step, so backward has GEMMs left after the first.
  // ddp starts its first bucket as soon as it is final (--overlap-after 0): held for half
  // of the buffer, it would start with the tiny model's embeddings, after the last GEMM.
  return parse_train_options({"--model", "tiny", "--layers", "2", "--seq", "16", "--global-batch", "24",
                              "--steps", "3", "--warmup-steps", "0", "--strategy", strategy, "--overlap",
                              overlap, "--bucket-mb", "0.01", "--overlap-after", "0"});
}

TEST(MultiprocessorReservation, HeldWhileBucketsOverlapBackwardNeverInForwardOrTheOptimizer) {
  for (const char* strategy : {"ddp", "zero2"}) {
    for (const char* overlap : {"off", "on"}) {
      const std::string label = std::string(strategy) + "+overlap " + overlap;
      MpiCommunicator mpi(MPI_COMM_WORLD, 120.0);
      LaneCommunicator comm(mpi);
      ReservationRecordingOps ops;
      {
        Trainer trainer(make_config(strategy, overlap), ops, comm, MPI_COMM_WORLD);
        trainer.run(nullptr);
      }
      EXPECT_EQ(ops.reserved(), 0) << label << ": a reservation outlived the run";
      EXPECT_GT(ops.updates_unreserved, 0) << label;
      EXPECT_EQ(ops.updates_reserved, 0) << label << ": the optimizer ran on fewer multiprocessors";
      EXPECT_GT(ops.forward_unreserved, 0) << label;
      EXPECT_EQ(ops.forward_reserved, 0) << label << ": forward ran on fewer multiprocessors";
      if (std::string(overlap) == "off") {
        for (int count : ops.requests) EXPECT_EQ(count, 0) << label << ": nothing overlaps, nothing is held";
        EXPECT_EQ(ops.backward_reserved, 0) << label;
        continue;
      }
      int held = 0;
      for (int count : ops.requests) {
        EXPECT_TRUE(count == 0 || count == kLaneMultiprocessors) << label << ": reserved " << count;
        held += count > 0;
      }
      EXPECT_GE(held, 3) << label << ": a reservation in each of the 3 steps";
      // Before the first bucket is final, backward's GEMMs have the whole GPU; after it,
      // they run beside the lane.
      EXPECT_GT(ops.backward_unreserved, 0) << label;
      EXPECT_GT(ops.backward_reserved, 0) << label;
    }
  }
}

}  // namespace
}  // namespace scalestudy
