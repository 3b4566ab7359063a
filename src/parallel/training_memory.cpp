#include "parallel/training_memory.h"

#include <climits>

#include "model/gpt.h"
#include "parallel/strategy.h"

namespace scalestudy {

bool rows_fit_the_ops(int micro_batch, int seq) {
  return static_cast<long long>(micro_batch) * static_cast<long long>(seq) <= INT_MAX;
}

MemoryEstimate estimate_training_memory(const TrainingMemoryInputs& in) {
  const ParameterLayout layout = make_parameter_layout(in.shape);
  MemoryEstimate estimate = plan_strategy_memory(
      {in.parallel, in.backend, in.comm, in.plan, layout, in.micro_batches});
  estimate[MemoryKind::parameters] += Gpt::parameter_bytes(in.backend, in.plan.padded_elems);
  estimate[MemoryKind::activations] +=
      Gpt::activation_bytes(in.backend, in.shape, in.micro_batch, in.seq, in.recompute);
  estimate[MemoryKind::other] += in.backend.allocated_bytes(MemoryKind::other);
  // A micro-batch beyond the ops' rows never runs; its activations alone tell how far off it is.
  if (rows_fit_the_ops(in.micro_batch, in.seq))
    estimate[MemoryKind::other] += in.backend.model_scratch_bytes(in.shape, in.micro_batch, in.seq);
  return estimate;
}

}  // namespace scalestudy
