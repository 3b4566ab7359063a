#include "parallel/training_memory.h"

#include <climits>

#include "model/gpt.h"

namespace scalestudy {

bool rows_fit_the_ops(int micro_batch, int seq) {
  return static_cast<long long>(micro_batch) * static_cast<long long>(seq) <= INT_MAX;
}

MemoryEstimate estimate_training_memory(const TrainingMemoryInputs& in) {
  const Backend& backend = in.strategy.backend;
  MemoryEstimate estimate = plan_strategy_memory(in.strategy);
  estimate[MemoryKind::parameters] += Gpt::parameter_bytes(backend, in.strategy.plan.padded_elems);
  estimate[MemoryKind::activations] +=
      Gpt::activation_bytes(backend, in.shape, in.micro_batch, in.seq, in.recompute);
  estimate[MemoryKind::other] += backend.allocated_bytes(MemoryKind::other);
  // A micro-batch beyond the ops' rows never runs; its activations alone tell how far off it is.
  if (rows_fit_the_ops(in.micro_batch, in.seq))
    estimate[MemoryKind::other] += backend.model_scratch_bytes(in.shape, in.micro_batch, in.seq);
  return estimate;
}

}  // namespace scalestudy
