#include "parallel/strategy_common.h"

#include <cmath>
#include <memory>
#include <vector>

#include "parallel/ddp_strategy.h"
#include "parallel/zero2_strategy.h"

namespace scalestudy {

bool adamw_over_range(Ops& ops, const ParameterLayout& layout, size_t param_begin,
                      size_t param_end, float* master, const float* grads, float* m, float* v,
                      const AdamWConfig& adamw, float learning_rate, int adam_step) {
  AdamWParams hyper;
  hyper.learning_rate = learning_rate;
  hyper.beta1 = adamw.beta1;
  hyper.beta2 = adamw.beta2;
  hyper.epsilon = adamw.epsilon;
  hyper.step = adam_step;
  std::vector<AdamWPiece> pieces;
  for_each_tensor_piece(layout, param_begin, param_end, [&](size_t lo, size_t hi, bool decay) {
    pieces.push_back(AdamWPiece{lo - param_begin, hi - param_begin,
                                decay ? adamw.weight_decay : 0.0f});
  });
  return ops.adamw_update_pieces(master, grads, m, v, pieces, hyper);
}

float* allocate_collective_buffer(Ops& ops, Communicator& comm, size_t elems, MemoryKind kind) {
  float* owned = comm.allocate_owned_buffer(elems, kind);
  return owned ? owned : ops.allocate_floats(elems, kind);
}

void release_collective_buffer(Ops& ops, Communicator& comm, float* buffer) {
  if (!comm.release_owned_buffer(buffer)) ops.release(buffer);
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

void reserve_for_overlapped_lane(Ops& ops, const Communicator& comm, bool overlapping) {
  ops.reserve_multiprocessors(overlapping ? comm.overlapped_lane_multiprocessors() : 0);
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

std::unique_ptr<GradientStrategy> make_strategy(const DataParallelConfig& config, Ops& ops,
                                                Communicator& comm, Gpt& model,
                                                const BucketPlan& plan) {
  if (config.strategy == Strategy::zero2)
    return std::make_unique<Zero2Strategy>(config, ops, comm, model, plan);
  return std::make_unique<DdpStrategy>(config, ops, comm, model, plan);
}

}  // namespace scalestudy
