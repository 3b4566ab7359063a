#include "parallel/ddp_strategy.h"

#include <cmath>

namespace scalestudy {

DdpStrategy::DdpStrategy(const DataParallelConfig& config, Backend& backend, Communicator& comm, Gpt& model,
                         const BucketPlan& plan)
    : config_(config), backend_(backend), comm_(comm), model_(model), plan_(plan),
      hold_until_elems_(hold_until_elems(config.overlap_after, plan)) {
  try {
    grads_ = backend_.allocate_floats(plan_.padded_elems, MemoryKind::gradients);
    m_ = backend_.allocate_floats(plan_.padded_elems, MemoryKind::optimizer);
    v_ = backend_.allocate_floats(plan_.padded_elems, MemoryKind::optimizer);
  } catch (...) {
    for (float* buffer : {grads_, m_, v_}) backend_.release(buffer);
    throw;
  }
  backend_.fill_zero(grads_, plan_.padded_elems);
  backend_.fill_zero(m_, plan_.padded_elems);
  backend_.fill_zero(v_, plan_.padded_elems);
}

MemoryEstimate DdpStrategy::planned_memory(const StrategyMemoryInputs& in) {
  const size_t elems = in.plan.padded_elems;
  MemoryEstimate estimate;
  estimate[MemoryKind::gradients] = in.backend.floats_bytes(elems, MemoryKind::gradients);
  estimate[MemoryKind::optimizer] =
      2 * in.backend.floats_bytes(elems, MemoryKind::optimizer) +
      in.backend.adamw_pieces_bytes(adamw_pieces(in.layout, 0, elems, in.config.adamw.weight_decay));
  const size_t largest_allreduce_elems = in.config.overlap ? in.plan.bucket_elems : elems;
  estimate[MemoryKind::communication] =
      in.comm.staging_bytes_for(CollectiveKind::allreduce, largest_allreduce_elems, gradient_wire(in.config));
  return estimate;
}

DdpStrategy::~DdpStrategy() {
  comm_.finish_all();
  backend_.release(grads_);
  backend_.release(m_);
  backend_.release(v_);
}

void DdpStrategy::begin_micro_batch(int micro_batch, int micro_batches) {
  // Gradients accumulate over the micro-batches of a step; only the last one's
  // backward communicates.
  if (micro_batch == 0) backend_.fill_zero(grads_, plan_.padded_elems);
  last_micro_batch_ = micro_batch == micro_batches - 1;
  next_bucket_ = static_cast<int>(plan_.buckets.size()) - 1;
}

float* DdpStrategy::tensor_gradients(size_t tensor_begin_elems) { return grads_ + tensor_begin_elems; }

std::vector<size_t> DdpStrategy::segment_cuts(int segment) const {
  return bucket_cuts(plan_, model_.layout().segments[segment]);
}

void DdpStrategy::segment_done_from(int segment, size_t offset_elems) {
  if (!config_.overlap || !last_micro_batch_) return;
  // Backward finishes gradients from the end of the buffer down, so every gradient at or
  // above this point is final.
  const size_t final_from = model_.layout().segments[segment].begin_elems + offset_elems;
  // Held until backward has finished the --overlap-after share (docs/strategies.md); the
  // final report of backward, at offset 0 of the embeddings, starts whatever is left.
  if (final_from > hold_until_elems_) return;
  LaneScope lane(comm_, lane_after_segment(model_.layout(), segment, offset_elems));
  while (next_bucket_ >= 0 && plan_.buckets[next_bucket_].begin_elems >= final_from) {
    // The rest of backward runs beside the buckets' allreduces.
    if (in_flight_.empty()) reserve_for_overlapped_lane(backend_, comm_, true);
    const Bucket& bucket = plan_.buckets[next_bucket_];
    in_flight_.push_back(start_allreduce(grads_ + bucket.begin_elems, bucket.elems()));
    --next_bucket_;
  }
}

CommHandle DdpStrategy::start_allreduce(float* gradients, size_t elems) {
  return comm_.start_allreduce(in_place(gradients, elems, "grad-comm", gradient_wire(config_)));
}

void DdpStrategy::finish_gradient_sync() {
  if (!config_.overlap) {
    in_flight_.push_back(start_allreduce(grads_, plan_.padded_elems));
  }
  // The latest one's wait covers the rest (Communicator::finish).
  if (!in_flight_.empty()) comm_.finish(in_flight_.back());
  in_flight_.clear();
  reserve_for_overlapped_lane(backend_, comm_, false);
}

OptimizerStats DdpStrategy::optimizer_step(float learning_rate, int adam_step, float grad_scale) {
  const OptimizerStats stats =
      unscale_and_clip(std::sqrt(backend_.sum_of_squares(grads_, plan_.padded_elems)), grad_scale, config_.grad_clip);
  if (stats.skipped) return stats;
  if (stats.clip_factor != 1.0f) backend_.scale(grads_, plan_.padded_elems, stats.clip_factor);
  // fp32 compute: the parameters are their own master weights.
  if (!adamw_over_range(backend_, model_.layout(), 0, plan_.padded_elems,
                        {.params = model_.params(), .grads = grads_, .m = m_, .v = v_},
                        adamw_params(config_.adamw, learning_rate, adam_step)))
    backend_.parameters_changed(model_.params(), 0, plan_.padded_elems);
  return stats;
}

StrategyMemory DdpStrategy::memory() const {
  StrategyMemory memory;
  memory.gradient_bytes = plan_.padded_elems * sizeof(float);
  memory.optimizer_bytes = 2 * plan_.padded_elems * sizeof(float);
  return memory;
}

}  // namespace scalestudy
