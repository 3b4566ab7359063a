// --overlap on with --overlap-after F (docs/strategies.md): no
// bucket starts until backward has finished the top F share of the gradient buffer; then
// every bucket finished so far starts, and each later one as soon as it is finished. ddp
// holds its buckets in the gradient buffer, zero2 in their staging. When a bucket starts
// changes nothing that is summed. Run by ctest at 1, 2, 3 and 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "forwarding_communicator.h"
#include "model/gpt.h"
#include "parallel/bucket_plan.h"
#include "parallel/ddp_strategy.h"
#include "parallel/zero2_strategy.h"
#include "train/trainer.h"
#include "training.h"

namespace scalestudy {
namespace {

// Records where each gradient collective begins (ddp's allreduce buffer, or the shard
// chunk that zero2's first micro-batch reduce-scatters into), and how many of them were
// in flight whenever compute waited for one.
class StartRecordingCommunicator final : public ForwardingCommunicator {
 public:
  explicit StartRecordingCommunicator(Communicator& inner) : ForwardingCommunicator(inner) {}
  CommHandle start_allreduce(const CollectiveArgs& args) override {
    return record(args, ForwardingCommunicator::start_allreduce(args));
  }
  CommHandle start_reduce_scatter(const CollectiveArgs& args) override {
    return record(args, ForwardingCommunicator::start_reduce_scatter(args));
  }
  void finish(CommHandle handle) override {
    if (open_.count(handle.id)) in_flight_at_waits.push_back(open_.size());
    open_.erase(handle.id);
    ForwardingCommunicator::finish(handle);
  }
  std::vector<const float*> started;
  std::vector<size_t> in_flight_at_waits;

 private:
  CommHandle record(const CollectiveArgs& args, CommHandle handle) {
    if (args.phase == "grad-comm") {
      started.push_back(static_cast<const float*>(args.recv));
      open_.insert(handle.id);
    }
    return handle;
  }
  std::set<uint64_t> open_;  // gradient collectives started and not yet waited for
};

RunConfig make_config(const std::string& strategy, const std::string& overlap_after, int layers,
                      int grad_accum = 1) {
  // Buckets of 0.01 MiB: several per block of the tiny model.
  return parse_train_options({"--model", "tiny", "--layers", std::to_string(layers), "--seq", "16",
                              "--global-batch", "24", "--grad-accum", std::to_string(grad_accum), "--steps", "3",
                              "--warmup-steps", "0", "--strategy", strategy, "--overlap", "on", "--bucket-mb",
                              "0.01", "--overlap-after", overlap_after});
}

// Where the share ends, from the buffer's top: the buckets wholly above wait for it.
size_t expected_hold_until(const RunConfig& config, const BucketPlan& plan) {
  return static_cast<size_t>((1.0 - config.overlap_after) * static_cast<double>(plan.padded_elems));
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
  for (const char* strategy : {"ddp", "zero2"})
    for (const char* overlap_after : {"0", "0.3", "0.5", "0.8", "0.99"}) {
      RunConfig config = make_config(strategy, overlap_after, 4);
      CpuOps ops;
      MpiCommunicator mpi(MPI_COMM_WORLD, 120.0);
      StartRecordingCommunicator comm(mpi);
      resolve_for_world(config, comm.world_size());
      const ParameterLayout layout = make_parameter_layout(config.shape);
      const BucketPlan plan = make_bucket_plan(layout.param_elems, config.bucket_mb * 1024.0 * 1024.0,
                                               comm.world_size(), layout.segments[layout.embedding_segment()].end_elems);
      ASSERT_GE(plan.buckets.size(), 8u) << "the test needs buckets throughout the buffer";
      Gpt model(ops, config.shape, config.micro_batch(), config.seq, plan.padded_elems);
      std::unique_ptr<GradientStrategy> gradients;
      // Where a recorded start lies in the gradient buffer: ddp's buffer is the whole of it;
      // zero2's shard holds chunk b of every bucket at begin_elems / world_size.
      std::function<size_t(const float*)> bucket_begin;
      if (config.strategy == Strategy::ddp) {
        auto ddp = std::make_unique<DdpStrategy>(config.data_parallel(), ops, comm, model, plan);
        const float* base = ddp->gradients();
        bucket_begin = [base](const float* p) { return static_cast<size_t>(p - base); };
        gradients = std::move(ddp);
      } else {
        auto zero2 = std::make_unique<Zero2Strategy>(config.data_parallel(), ops, comm, model, plan);
        const float* base = zero2->shard_gradients();
        const size_t world = static_cast<size_t>(comm.world_size());
        bucket_begin = [base, world](const float* p) { return static_cast<size_t>(p - base) * world; };
        gradients = std::move(zero2);
      }
      const size_t hold_until_elems = expected_hold_until(config, plan);

      gradients->begin_micro_batch(0, 1);
      bool held_some = false;
      size_t released = 0;  // buckets started by the report that ends the hold
      std::set<size_t> all_started;  // bucket offsets started so far in this backward
      int begun_segment = -1;
      for (const Report& report : backward_reports(layout, *gradients)) {
        comm.started.clear();
        comm.in_flight_at_waits.clear();
        // Begun once, before its first part, as backward does: zero2 takes staging then.
        if (report.segment != begun_segment) gradients->begin_segment(report.segment);
        begun_segment = report.segment;
        gradients->segment_done_from(report.segment, report.offset_elems);
        std::set<size_t> started;
        for (const float* buffer : comm.started) started.insert(bucket_begin(buffer));
        const std::string label = std::string(strategy) + " --overlap-after " + overlap_after +
                                  ", gradients final from " + std::to_string(report.final_from_elems) + " of " +
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
        if (held_some && all_started.empty()) released = started.size();
        all_started.insert(started.begin(), started.end());
        // Backward waits for a bucket only beyond zero2's bound, and the released buckets
        // count on top of it: waiting for them would hold backward up (ddp never waits).
        for (size_t in_flight : comm.in_flight_at_waits)
          EXPECT_GT(in_flight, Zero2Strategy::kMaxBucketsInFlight + released)
              << label << ": backward waited with " << in_flight << " buckets in flight, " << released
              << " of them released";
      }
      EXPECT_EQ(all_started.size(), plan.buckets.size()) << strategy << " " << overlap_after << ": buckets never started";
      EXPECT_EQ(held_some, config.overlap_after > 0) << strategy << " " << overlap_after;
      gradients->finish_gradient_sync();
    }
}

// The same buckets are summed the same way, whenever they start: bit-identical training,
// over two micro-batches too (zero2 reduces each one's buckets).
TEST(OverlapAfter, TrainsBitIdenticallyWheneverTheBucketsStart) {
  for (const char* strategy : {"ddp", "zero2"})
    for (int grad_accum : {1, 2}) {
      const std::vector<float> reference = train_on_cpu(make_config(strategy, "0", 2, grad_accum));
      for (const char* overlap_after : {"0.5", "0.9"}) {
        const std::vector<float> held = train_on_cpu(make_config(strategy, overlap_after, 2, grad_accum));
        ASSERT_EQ(held.size(), reference.size());
        EXPECT_EQ(count_differing(held, reference), 0u)
            << strategy << " --grad-accum " << grad_accum << " --overlap-after " << overlap_after
            << ": parameters that differ from 0";
      }
    }
}

// zero2 pays for the hold in staging: the held buckets' gradients are all staged at once
// when they start, and the memory report counts them.
TEST(OverlapAfter, Zero2StagesTheHeldBucketsAndReportsThem) {
  for (const char* overlap_after : {"0", "0.5", "0.9", "auto"}) {
    CpuOps ops;
    MpiCommunicator comm(MPI_COMM_WORLD, 120.0);
    const int world = comm.world_size();
    Trainer trainer(make_config("zero2", overlap_after, 8), ops, comm, MPI_COMM_WORLD);
    trainer.run(nullptr);
    const RunConfig& config = trainer.config();
    const BucketPlan& plan = trainer.plan();
    const size_t hold_until_elems = expected_hold_until(config, plan);
    // The held buckets start in the first report that makes the gradients final below the
    // share; until then each one that is final waits in its staging. The embeddings'
    // buckets take none (they are staged in the embedding scratch).
    const ParameterLayout layout = make_parameter_layout(config.shape);
    size_t release_from = 0;
    for (const Report& report : backward_reports(layout, trainer.strategy()))
      if (report.final_from_elems <= hold_until_elems) {
        release_from = report.final_from_elems;
        break;
      }
    const size_t embedding_chunks_end = plan.round_up_to_chunks(layout.segments[layout.embedding_segment()].end_elems);
    size_t held = 0, staged_at_release = 0;
    for (const Bucket& bucket : plan.buckets) {
      if (bucket.begin_elems < embedding_chunks_end) continue;
      held += bucket.begin_elems > hold_until_elems;
      staged_at_release += bucket.end_elems > release_from;
    }
    const size_t staging_bytes = plan.bucket_elems * sizeof(float);
    const size_t received_bytes = plan.bucket_elems / world * sizeof(float);
    const size_t communication_bytes = trainer.strategy().memory().communication_bytes;
    const std::string label = std::string("--overlap-after ") + overlap_after + ", " + std::to_string(held) +
                              " of " + std::to_string(plan.buckets.size()) + " buckets held";
    EXPECT_GE(communication_bytes, held * staging_bytes) << label << ": the held buckets' staging is not reported";
    EXPECT_LE(communication_bytes,
              (staged_at_release + Zero2Strategy::kMaxBucketsInFlight + Zero2Strategy::kMaxBucketsFilled) *
                  (staging_bytes + received_bytes))
        << label;
    EXPECT_EQ(ops.allocated_bytes(MemoryKind::communication), communication_bytes) << label;
    if (std::string(overlap_after) == "auto") {
      // auto holds half the gradients, and on N ranks at most 1/N: no more than the shard.
      EXPECT_EQ(config.overlap_after, std::min(kAutoOverlapAfter, 1.0 / world)) << label;
      EXPECT_LE(held * staging_bytes, plan.shard_elems() * sizeof(float)) << label << ": held more than the shard";
      EXPECT_GT(held, 0u) << label;
    }
    if (config.overlap_after >= 0.5) {
      EXPECT_GE(held, plan.buckets.size() / 3) << label << ": the test holds too little";
    }
  }
}

}  // namespace
}  // namespace scalestudy
