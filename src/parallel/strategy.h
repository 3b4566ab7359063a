#pragma once
// A data-parallel strategy: where gradients live, when they are communicated, and how
// the optimizer updates the parameters. The trainer drives one step as
//
//   begin_step()                      zero2+overlap: start the parameter allgathers
//   for each micro-batch:
//     forward(hooks = strategy)       zero2+overlap: wait for a bucket before using it
//     backward(sink = strategy)       overlap: start each bucket once backward filled it
//   finish_gradient_sync()            wait for the gradient collectives still in flight
//   optimizer_step()                  clip, AdamW, and (zero2, no overlap) allgather
//
// Timeline of the two streams for ddp with overlap (buckets b2, b1, b0 in reverse
// layer order):
//
//   compute: | forward | backward L-1 .. | backward .. | backward .. 0 |      | optimizer |
//   comm:                        | allreduce b2 | allreduce b1 |  allreduce b0 |
//                                                                 ^ finish_gradient_sync
#include <memory>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/data_parallel_config.h"
#include "core/memory_estimate.h"
#include "model/gpt.h"
#include "parallel/bucket_plan.h"

namespace scalestudy {

// What a strategy's buffers are predicted to take before it is made (the memory
// preflight): its constructor's allocations exactly, as the backend counts them, and, for
// the buffers that grow in the first steps (zero2's bucket staging and receive buffers,
// the communicator's bf16 staging), the most they can grow to.
struct StrategyMemoryInputs {
  const DataParallelConfig& config;
  const Backend& backend;
  const Communicator& comm;
  const BucketPlan& plan;
  const ParameterLayout& layout;
  int micro_batches = 1;  // --grad-accum
};

struct StrategyMemory {
  size_t gradient_bytes = 0;       // every buffer that holds gradients
  size_t optimizer_bytes = 0;      // master weights (where separate), m, v
  size_t communication_bytes = 0;  // staging and receive buffers, at their peak
};

struct OptimizerStats {
  double grad_norm = 0.0;  // global norm before clipping, after unscaling
  float clip_factor = 1.0f;
  bool skipped = false;    // the gradients were not finite: nothing was updated
};

class GradientStrategy : public GradientSink, public ForwardHooks {
 public:
  ~GradientStrategy() override = default;
  virtual const char* name() const = 0;
  virtual const BucketPlan& plan() const = 0;

  virtual void begin_step() = 0;
  virtual void begin_micro_batch(int micro_batch, int micro_batches) = 0;
  virtual void finish_gradient_sync() = 0;
  // grad_scale multiplies the gradients before clipping (1/loss scale). When their norm
  // is not finite the step is skipped: no parameter, moment or step count changes.
  // adam_step counts the updates applied so far (1-based), for bias correction.
  virtual OptimizerStats optimizer_step(float learning_rate, int adam_step, float grad_scale) = 0;
  // Completes any parameter communication still pending, so params() is whole.
  virtual void finish_param_sync() = 0;

  virtual StrategyMemory memory() const = 0;
};

// The gradients, optimizer and communication kinds of the chosen strategy's prediction.
MemoryEstimate plan_strategy_memory(const StrategyMemoryInputs& inputs);

// Chooses the strategy from the config. The plan pads the buffer for the world size.
std::unique_ptr<GradientStrategy> make_strategy(const DataParallelConfig& config, Backend& backend,
                                                Communicator& comm, Gpt& model,
                                                const BucketPlan& plan);

}  // namespace scalestudy
