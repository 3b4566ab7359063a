#pragma once
// Pieces that ddp and zero2 share.
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "config/data_parallel_config.h"
#include "model/parameter_layout.h"
#include "parallel/strategy.h"

namespace scalestudy {

// AdamW over the parameters [param_begin, param_end) of the flat buffer, with weight
// decay on the matrices only, in one adamw_update_pieces call. master, grads, m and v
// point at the element that corresponds to param_begin. Returns what that call returns:
// true where the backend has refreshed its compute copy of the range already.
bool adamw_over_range(Ops& ops, const ParameterLayout& layout, size_t param_begin,
                      size_t param_end, float* master, const float* grads, float* m, float* v,
                      const AdamWConfig& adamw, float learning_rate, int adam_step);

// A buffer that collectives run on: the communicator's when it wants to own it
// (Communicator::allocate_owned_buffer), the backend's otherwise.
float* allocate_collective_buffer(Ops& ops, Communicator& comm, size_t elems, MemoryKind kind);
void release_collective_buffer(Ops& ops, Communicator& comm, float* buffer);

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
void reserve_for_overlapped_lane(Ops& ops, const Communicator& comm, bool overlapping);

// The factor that brings the global gradient norm down to max_norm (1 when below it
// or when clipping is off).
float clip_factor(double grad_norm, float max_norm);

// Turns the norm of the (loss-scaled) gradients into the optimizer's decision: skip on
// a non-finite norm, otherwise the factor that unscales and clips them.
OptimizerStats unscale_and_clip(double scaled_norm, float grad_scale, float max_norm);

}  // namespace scalestudy
