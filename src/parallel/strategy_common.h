#pragma once
// Pieces that ddp and zero2 share.
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/data_parallel_config.h"
#include "model/parameter_layout.h"
#include "parallel/strategy.h"

namespace scalestudy {

// AdamW's hyper-parameters for one step: the learning rate and step given, the rest from
// the config, with its weight decay (the decay of the tensors that are decayed).
AdamWParams adamw_params(const AdamWConfig& adamw, float learning_rate, int adam_step);
// The pieces of [param_begin, param_end) that one adamw_update_pieces call takes: one per
// tensor it overlaps, offsets from param_begin, the matrices with `weight_decay`.
std::vector<AdamWPiece> adamw_pieces(const ParameterLayout& layout, size_t param_begin, size_t param_end,
                                     float weight_decay);
// AdamW over the parameters [param_begin, param_end) of the flat buffer, with
// hyper.weight_decay on the matrices only, in one adamw_update_pieces call. The tensors
// point at the element that corresponds to param_begin. Returns what that call returns:
// true where the backend has refreshed its compute copy of the range already.
bool adamw_over_range(Ops& ops, const ParameterLayout& layout, size_t param_begin,
                      size_t param_end, const AdamWTensors& tensors, const AdamWParams& hyper);

// What the gradients cross ranks in (--grad-reduce).
inline WireType gradient_wire(const DataParallelConfig& config) {
  return config.grad_reduce == Precision::bf16 ? WireType::bf16_from_f32 : WireType::f32;
}

// The offsets into `segment` where buckets of the plan begin, ascending (GradientSink::
// segment_cuts).
std::vector<size_t> bucket_cuts(const BucketPlan& plan, const Segment& segment);

// The lane of the buckets that backward's report of `segment`, from offset_elems to its end,
// completes: overlapped while backward still has compute to hide them behind (the LM
// head's weight gradient follows every block and every part of the embeddings), awaited
// for the embeddings' last part, which nothing follows.
CommLane lane_after_segment(const ParameterLayout& layout, int segment, size_t offset_elems);

// --overlap-after: no bucket starts while backward's gradients are final only above this
// offset of the plan's buffer (the whole buffer at 0: nothing is held).
size_t hold_until_elems(double overlap_after, const BucketPlan& plan);

// Sizes the backend's kernels for the multiprocessors that the overlapped lane's
// collectives leave free, from now until the call with `overlapping` false.
void reserve_for_overlapped_lane(DeviceServices& device, const Communicator& comm, bool overlapping);

// The factor that brings the global gradient norm down to max_norm (1 when below it
// or when clipping is off).
float clip_factor(double grad_norm, float max_norm);

// Turns the norm of the (loss-scaled) gradients into the optimizer's decision: skip on
// a non-finite norm, otherwise the factor that unscales and clips them.
OptimizerStats unscale_and_clip(double scaled_norm, float grad_scale, float max_norm);

}  // namespace scalestudy
