#pragma once
// zero2: each rank owns one shard of the padded buffer (its chunk of every bucket). It
// keeps the gradients and AdamW moments of that shard only. Its fp32 master weights are
// its chunks of the fp32 parameters, as ddp's are the whole of them: every replica holds
// them, and the allgathers overwrite only the other ranks' chunks.
//
// Backward writes each tensor's gradients straight into the staging buffer of the bucket
// it lies in. The few tensors that cross a bucket's edge, and segments over more than
// kMaxBucketsFilled buckets, go to a scratch buffer instead, copied into staging when
// backward reports them done. The buckets of the embeddings alone (BucketPlan's region
// finished last) are staged in the embedding scratch, so the tied embedding needs no
// copy. Each bucket that is then complete is reduce-scattered into the shard. At most
// kMaxBucketsInFlight buckets are reduced at once. Gradient memory is therefore the
// shard, the scratch, and a few buckets. The scratch is one block's gradient plus the
// tied embedding's, which backward reports in parts (GradientSink::segment_done_from):
// the embedding backward and then the LM head's weight gradient, a range of rows at a
// time.
//
// With --overlap-after F, complete buckets wait in their staging until backward has
// finished the top F share of the buffer, and then start together, in flight on top of
// kMaxBucketsInFlight: gradient memory then also holds those buckets (under auto, at
// most one shard's worth).
//
// After the update each rank's chunk is allgathered back into every replica. Where the
// backend's ops read a 16-bit copy of the parameters (Ops::compute_copy_of: bf16, fp16),
// the gathers move that copy, 2 bytes a parameter, which the fused AdamW wrote for this
// rank's chunks; the other ranks' chunks of the fp32 parameters, which nothing reads
// during training, then fall behind until finish_param_sync() gathers them. Otherwise
// the fp32 parameters themselves are gathered. Without overlap that happens at the end of
// optimizer_step; with overlap the allgathers are started at the next begin_step() and
// forward waits for each bucket just before the first segment that reads it.
#include <cstdint>
#include <deque>
#include <vector>

#include "parallel/strategy.h"
#include "parallel/strategy_common.h"

namespace scalestudy {

class Zero2Strategy final : public GradientStrategy {
 public:
  static constexpr size_t kMaxBucketsInFlight = 2;
  // Staging written by backward but not yet reduced: a block's gradients fall in two
  // buckets at most, or go through scratch.
  static constexpr size_t kMaxBucketsFilled = 2;

  Zero2Strategy(const DataParallelConfig& config, Backend& backend, Communicator& comm, Gpt& model, const BucketPlan& plan);
  ~Zero2Strategy() override;
  // The shard's gradients, m and v (and the backend's AdamW tables of its chunks) and the
  // two scratch buffers, as the constructor allocates them; the bucket staging and receive buffers at the most the pools grow to
  // (the buckets being filled, in flight and held, BucketBounds), and the communicator's
  // staging for the largest reduce-scatter.
  static MemoryEstimate planned_memory(const StrategyMemoryInputs& inputs);

  const char* name() const override { return "zero2"; }
  const BucketPlan& plan() const override { return plan_; }
  void begin_segment(int segment) override;
  float* tensor_gradients(size_t tensor_begin_elems) override;
  void segment_done(int segment) override { segment_done_from(segment, 0); }
  std::vector<size_t> segment_cuts(int segment) const override;
  void segment_done_from(int segment, size_t offset_elems) override;
  void before_segment_forward(int segment) override;

  void begin_step() override;
  void begin_micro_batch(int micro_batch, int micro_batches) override;
  void finish_gradient_sync() override;
  OptimizerStats optimizer_step(float learning_rate, int adam_step, float grad_scale) override;
  void finish_param_sync() override;
  StrategyMemory memory() const override;

  const float* shard_gradients() const { return shard_grads_; }

 private:
  // The fixed buffers' sizes, which the constructor allocates and planned_memory counts.
  struct FixedSizes {
    size_t shard_elems = 0;
    int embedding_staged_buckets = 0;  // the lowest buckets, staged in the embedding scratch
    size_t embedding_scratch_elems = 0;
    size_t block_scratch_elems = 0;
  };
  static FixedSizes fixed_sizes(const BucketPlan& plan, const ParameterLayout& layout);
  // The most staging and receive buffers the pools hold at once.
  struct PoolBounds {
    size_t staging = 0;
    size_t received = 0;
  };
  static PoolBounds pool_bounds(const StrategyMemoryInputs& inputs, int embedding_staged_buckets);

  struct BucketState {
    float* staging = nullptr;  // the bucket's gradients, all ranks' chunks
    float* received = nullptr; // this rank's reduced chunk, after the first micro-batch
    CommHandle reduce{};
    CommHandle gather{};
    bool reducing = false;
    bool gathering = false;
  };
  // Gradients of a begun segment that backward writes into scratch: a tensor that crosses
  // a bucket's edge, or a whole segment over more than kMaxBucketsFilled buckets.
  struct ScratchRange {
    int segment = 0;
    size_t begin_elems = 0, end_elems = 0;
    float* scratch = nullptr;
  };
  float* acquire_buffer(std::vector<float*>& pool, size_t elems);
  int bucket_of(size_t elem) const;
  // The bucket's staging for this micro-batch, taken (and its padding zeroed) on first use.
  float* staging_for(int bucket);
  void start_reduce(int bucket);
  // Zeroes the part of a bucket's staging that lies beyond the model's parameters.
  void zero_bucket_padding(int bucket, float* staging);
  void complete_reduce(int bucket);
  void start_gathers();
  void complete_gather(int bucket);
  // Starts the gathers still pending and waits for them: the parameters that forward reads
  // are then whole.
  void sync_forward_parameters();
  bool overlaps(int bucket, size_t begin, size_t end) const;

  const DataParallelConfig config_;
  Backend& backend_;
  Communicator& comm_;
  Gpt& model_;
  BucketPlan plan_;
  int rank_ = 0;
  // --overlap-after: no bucket is reduced until backward's gradients are final from here up.
  size_t hold_until_elems_ = 0;
  // Buckets this micro-batch started when the hold ended: in flight on top of the bound.
  size_t released_ = 0;

  float* shard_grads_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
  float* embedding_scratch_ = nullptr;
  size_t embedding_scratch_elems_ = 0;
  int embedding_staged_buckets_ = 0;  // the lowest buckets, staged in embedding_scratch_
  float* block_scratch_ = nullptr;
  size_t block_scratch_elems_ = 0;

  std::vector<BucketState> buckets_;
  std::vector<ScratchRange> scratch_ranges_;
  std::vector<float*> free_staging_, free_received_;
  std::vector<float*> all_buffers_;
  size_t comm_buffer_bytes_ = 0;
  std::deque<int> reducing_;
  int next_bucket_ = -1;
  bool first_micro_batch_ = true;
  // The segment whose parts backward is reporting (-1 for none) and where its last part began.
  int reported_segment_ = -1;
  size_t reported_from_elems_ = 0;
  bool gather_pending_ = false;
  // The 16-bit copy that the backend's ops read, which the gathers then move; nullptr
  // where they read the fp32 parameters.
  uint16_t* compute_copy_ = nullptr;
  // The gathers moved the copy only: the other ranks' chunks of the fp32 parameters are
  // older than it until finish_param_sync().
  bool masters_behind_ = false;
  // The last optimizer step refreshed the compute copy of this rank's chunks itself.
  bool own_chunks_refreshed_ = false;
};

}  // namespace scalestudy
