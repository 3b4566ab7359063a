#include "parallel/strategy_common.h"

#include <cmath>
#include <memory>
#include <vector>

#include "parallel/ddp_strategy.h"
#include "parallel/zero2_strategy.h"

namespace scalestudy {

AdamWParams adamw_params(const AdamWConfig& adamw, float learning_rate, int adam_step) {
  AdamWParams hyper;
  hyper.learning_rate = learning_rate;
  hyper.beta1 = adamw.beta1;
  hyper.beta2 = adamw.beta2;
  hyper.epsilon = adamw.epsilon;
  hyper.weight_decay = adamw.weight_decay;
  hyper.step = adam_step;
  return hyper;
}

std::vector<AdamWPiece> adamw_pieces(const ParameterLayout& layout, size_t param_begin, size_t param_end,
                                     float weight_decay) {
  std::vector<AdamWPiece> pieces;
  for_each_tensor_piece(layout, param_begin, param_end, [&](size_t lo, size_t hi, bool decay) {
    pieces.push_back(AdamWPiece{lo - param_begin, hi - param_begin, decay ? weight_decay : 0.0f});
  });
  return pieces;
}

bool adamw_over_range(Ops& ops, const ParameterLayout& layout, size_t param_begin,
                      size_t param_end, const AdamWTensors& tensors, const AdamWParams& hyper) {
  return ops.adamw_update_pieces(tensors.params, tensors.grads, tensors.m, tensors.v,
                                 adamw_pieces(layout, param_begin, param_end, hyper.weight_decay), hyper);
}

std::vector<size_t> bucket_cuts(const BucketPlan& plan, const Segment& segment) {
  std::vector<size_t> cuts;
  for (const Bucket& bucket : plan.buckets)
    if (bucket.begin_elems > segment.begin_elems && bucket.begin_elems < segment.end_elems)
      cuts.push_back(bucket.begin_elems - segment.begin_elems);
  return cuts;
}

size_t hold_until_elems(double overlap_after, const BucketPlan& plan) {
  return static_cast<size_t>((1.0 - overlap_after) * static_cast<double>(plan.padded_elems));
}

CommLane lane_after_segment(const ParameterLayout& layout, int segment, size_t offset_elems) {
  return segment == layout.embedding_segment() && offset_elems == 0 ? CommLane::awaited
                                                                     : CommLane::overlapped;
}

void reserve_for_overlapped_lane(DeviceServices& device, const Communicator& comm, bool overlapping) {
  device.reserve_multiprocessors(overlapping ? comm.overlapped_lane_multiprocessors() : 0);
}

float clip_factor(double grad_norm, float max_norm) {
  if (max_norm <= 0.0f || grad_norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / (grad_norm + 1e-6));
}

OptimizerStats unscale_and_clip(double scaled_norm, float grad_scale, float max_norm) {
  OptimizerStats stats;
  stats.grad_norm = scaled_norm * grad_scale;
  if (!std::isfinite(scaled_norm)) {
    stats.skipped = true;
    stats.clip_factor = 0.0f;
    return stats;
  }
  stats.clip_factor = clip_factor(stats.grad_norm, max_norm) * grad_scale;
  return stats;
}

MemoryEstimate plan_strategy_memory(const StrategyMemoryInputs& inputs) {
  if (inputs.config.strategy == Strategy::zero2) return Zero2Strategy::planned_memory(inputs);
  return DdpStrategy::planned_memory(inputs);
}

std::unique_ptr<GradientStrategy> make_strategy(const DataParallelConfig& config, Backend& backend,
                                                Communicator& comm, Gpt& model,
                                                const BucketPlan& plan) {
  if (config.strategy == Strategy::zero2)
    return std::make_unique<Zero2Strategy>(config, backend, comm, model, plan);
  return std::make_unique<DdpStrategy>(config, backend, comm, model, plan);
}

}  // namespace scalestudy
