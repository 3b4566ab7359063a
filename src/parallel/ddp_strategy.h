#pragma once
// ddp: every rank holds the whole gradient and the whole optimizer state; gradients are
// summed with allreduce (the loss scale already divides by the world size). Without
// overlap one allreduce covers the buffer after backward; with overlap each bucket is
// started as soon as backward has finished every gradient in it, and the buffer's top
// --overlap-after share of it is final: the buckets finished before that start together.
#include <vector>

#include "parallel/strategy.h"
#include "parallel/strategy_common.h"

namespace scalestudy {

class DdpStrategy final : public GradientStrategy {
 public:
  DdpStrategy(const DataParallelConfig& config, Backend& backend, Communicator& comm, Gpt& model, const BucketPlan& plan);
  ~DdpStrategy() override;
  // The whole padded gradient, m and v (and the backend's AdamW table of the buffer), and
  // the communicator's staging for the largest allreduce: the whole gradient without
  // overlap, the largest bucket with it.
  static MemoryEstimate planned_memory(const StrategyMemoryInputs& inputs);

  const char* name() const override { return "ddp"; }
  const BucketPlan& plan() const override { return plan_; }
  float* tensor_gradients(size_t tensor_begin_elems) override;
  void segment_done(int segment) override { segment_done_from(segment, 0); }
  std::vector<size_t> segment_cuts(int segment) const override;
  void segment_done_from(int segment, size_t offset_elems) override;
  void before_segment_forward(int) override {}

  void begin_step() override {}
  void begin_micro_batch(int micro_batch, int micro_batches) override;
  void finish_gradient_sync() override;
  OptimizerStats optimizer_step(float learning_rate, int adam_step, float grad_scale) override;
  void finish_param_sync() override {}
  StrategyMemory memory() const override;

  const float* gradients() const { return grads_; }

 private:
  // Starts the sum of a range of the gradients, in the --grad-reduce precision.
  CommHandle start_allreduce(float* gradients, size_t elems);

  const DataParallelConfig config_;
  Backend& backend_;
  Communicator& comm_;
  Gpt& model_;
  BucketPlan plan_;
  float* grads_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
  bool last_micro_batch_ = true;
  int next_bucket_ = -1;  // buckets are started from the last one down to 0
  // Buckets start once backward's final gradients reach down to here (--overlap-after).
  size_t hold_until_elems_ = 0;
  std::vector<CommHandle> in_flight_;
};

}  // namespace scalestudy
