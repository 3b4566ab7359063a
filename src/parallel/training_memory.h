#pragma once
// The memory preflight's estimate of one rank's training run: every buffer the run
// allocates through the backend and the communicator, by kind, for the strategy, the
// precision and the recomputation in use. Each term comes from the size functions that
// the allocations themselves use (Gpt::parameter_bytes and activation_bytes, the
// strategies' planned_memory, the backend's scratch and the communicator's staging), so
// the estimate is what the run allocates, exactly for the buffers that the constructors
// allocate, and an upper bound for the ones that grow in the first steps.
#include "core/memory_estimate.h"
#include "core/model_shape.h"
#include "parallel/strategy.h"

namespace scalestudy {

struct TrainingMemoryInputs {
  StrategyMemoryInputs strategy;  // its layout is make_parameter_layout(shape)
  const ModelShape& shape;
  int micro_batch = 1;  // sequences per micro-batch
  int seq = 1;
  bool recompute = false;
};

// The estimate includes what the backend holds already (its start-up workspaces, under
// other), so that it compares with the backend's own accounting; what the run still has
// to allocate is the estimate less that.
MemoryEstimate estimate_training_memory(const TrainingMemoryInputs& inputs);

// Whether the ops can run a micro-batch of this many tokens: they count rows in int.
bool rows_fit_the_ops(int micro_batch, int seq);

}  // namespace scalestudy
