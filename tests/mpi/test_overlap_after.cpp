// ddp with --overlap on and --overlap-after F (docs/performance-notes.md, change 43): no
// bucket starts until backward has finished the top F share of the gradient buffer; then
// every bucket finished so far starts, and each later one as soon as it is finished. When
// a bucket starts changes nothing that is summed. Run by ctest at 1, 2, 3 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "forwarding_communicator.h"
#include "model/gpt.h"
#include "parallel/bucket_plan.h"
#include "parallel/ddp_strategy.h"
#include "train/trainer.h"
#include "cpu_training.h"
#include "train_args.h"

namespace scalestudy {
namespace {

// Records where each gradient allreduce begins, as an offset into the gradient buffer.
class StartRecordingCommunicator final : public ForwardingCommunicator {
 public:
  explicit StartRecordingCommunicator(Communicator& inner) : ForwardingCommunicator(inner) {}
  CommHandle start_allreduce(float* buffer, size_t elems, const std::string& phase) override {
    if (phase == "grad-comm") started.push_back(buffer);
    return ForwardingCommunicator::start_allreduce(buffer, elems, phase);
  }
  std::vector<const float*> started;
};

RunConfig make_config(const std::string& overlap_after, int layers) {
  // Buckets of 0.01 MiB: several per block of the tiny model.
  return parse_train_options({"--model", "tiny", "--layers", std::to_string(layers), "--seq", "16",
                              "--global-batch", "24", "--steps", "3", "--warmup-steps", "0", "--strategy", "ddp",
                              "--overlap", "on", "--bucket-mb", "0.01", "--overlap-after", overlap_after});
}

// Backward's reports, in the order the model makes them: the final norm, the blocks from
// the last down, then the embeddings from their top down in the parts the strategy asks
// for, the last at offset 0. Each is given with the lowest offset it makes final.
struct Report {
  int segment;
  size_t offset_elems;
  size_t final_from_elems;
};

std::vector<Report> backward_reports(const ParameterLayout& layout, const GradientStrategy& strategy) {
  std::vector<Report> reports;
  for (int segment = layout.final_norm_segment(); segment > layout.embedding_segment(); --segment)
    reports.push_back({segment, 0, layout.segments[segment].begin_elems});
  const int embedding = layout.embedding_segment();
  std::vector<size_t> cuts = strategy.segment_cuts(embedding);
  for (auto cut = cuts.rbegin(); cut != cuts.rend(); ++cut)
    reports.push_back({embedding, *cut, layout.segments[embedding].begin_elems + *cut});
  reports.push_back({embedding, 0, layout.segments[embedding].begin_elems});
  return reports;
}

TEST(OverlapAfter, BucketsWaitForTheShareThenStartAsTheyFinish) {
  for (const char* overlap_after : {"0", "0.3", "0.5", "0.8", "0.99"}) {
    RunConfig config = make_config(overlap_after, 4);
    CpuOps ops;
    MpiCommunicator mpi(MPI_COMM_WORLD, 120.0);
    StartRecordingCommunicator comm(mpi);
    resolve_batch_for_world(config, comm.world_size());
    const ParameterLayout layout = make_parameter_layout(config.shape);
    const BucketPlan plan = make_bucket_plan(layout.param_elems, config.bucket_mb * 1024.0 * 1024.0,
                                             comm.world_size(), layout.segments[layout.embedding_segment()].end_elems);
    ASSERT_GE(plan.buckets.size(), 8u) << "the test needs buckets throughout the buffer";
    Gpt model(ops, config.shape, config.micro_batch(), config.seq, plan.padded_elems);
    DdpStrategy ddp(config, ops, comm, model, plan);
    const size_t hold_until_elems =
        static_cast<size_t>((1.0 - config.overlap_after) * static_cast<double>(plan.padded_elems));

    ddp.begin_micro_batch(0, 1);
    bool held_some = false;
    std::set<size_t> all_started;  // bucket offsets started so far in this backward
    for (const Report& report : backward_reports(layout, ddp)) {
      comm.started.clear();
      ddp.segment_done_from(report.segment, report.offset_elems);
      std::set<size_t> started;
      for (const float* buffer : comm.started) started.insert(static_cast<size_t>(buffer - ddp.gradients()));
      const std::string label = std::string("--overlap-after ") + overlap_after + ", gradients final from " +
                                std::to_string(report.final_from_elems) + " of " +
                                std::to_string(plan.padded_elems);
      if (report.final_from_elems > hold_until_elems) {
        EXPECT_TRUE(started.empty()) << label << ": a bucket started before the share was finished";
        held_some = true;
        continue;
      }
      // Every bucket wholly final by now has started, in this report or an earlier one.
      size_t expected_new = 0;
      for (const Bucket& bucket : plan.buckets)
        if (bucket.begin_elems >= report.final_from_elems && !all_started.count(bucket.begin_elems)) {
          ++expected_new;
          EXPECT_TRUE(started.count(bucket.begin_elems)) << label << ": bucket at " << bucket.begin_elems;
        }
      EXPECT_EQ(started.size(), expected_new) << label << ": buckets not yet final started";
      all_started.insert(started.begin(), started.end());
    }
    EXPECT_EQ(all_started.size(), plan.buckets.size()) << overlap_after << ": buckets never started";
    EXPECT_EQ(held_some, config.overlap_after > 0) << overlap_after;
    ddp.finish_gradient_sync();
  }
}

// The same buckets are summed the same way, whenever they start: bit-identical training.
TEST(OverlapAfter, TrainsBitIdenticallyWheneverTheBucketsStart) {
  const std::vector<float> reference = train_on_cpu(make_config("0", 2));
  for (const char* overlap_after : {"0.5", "0.9"}) {
    const std::vector<float> held = train_on_cpu(make_config(overlap_after, 2));
    ASSERT_EQ(held.size(), reference.size());
    EXPECT_EQ(count_differing(held, reference), 0u) << "--overlap-after " << overlap_after << ": parameters that differ from 0";
  }
}

}  // namespace
}  // namespace scalestudy
