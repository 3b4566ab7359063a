#include "parallel/zero2_strategy.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace scalestudy {

Zero2Strategy::Zero2Strategy(const DataParallelConfig& config, Backend& backend, Communicator& comm, Gpt& model,
                             const BucketPlan& plan)
    : config_(config), backend_(backend), comm_(comm), model_(model), plan_(plan),
      rank_(comm.rank()),
      hold_until_elems_(hold_until_elems(config.overlap_after, plan)),
      compute_copy_(backend.compute_copy_of(model.params())) {
  SCALESTUDY_CHECK(plan_.world_size == comm.world_size(), "bucket plan for another world size");
  const FixedSizes sizes = fixed_sizes(plan_, model_.layout());
  const size_t shard = sizes.shard_elems;
  embedding_staged_buckets_ = sizes.embedding_staged_buckets;
  embedding_scratch_elems_ = sizes.embedding_scratch_elems;
  block_scratch_elems_ = sizes.block_scratch_elems;
  try {
    shard_grads_ = backend_.allocate_floats(shard, MemoryKind::gradients);
    m_ = backend_.allocate_floats(shard, MemoryKind::optimizer);
    v_ = backend_.allocate_floats(shard, MemoryKind::optimizer);
    embedding_scratch_ = backend_.allocate_floats(embedding_scratch_elems_, MemoryKind::gradients);
    block_scratch_ = backend_.allocate_floats(block_scratch_elems_, MemoryKind::gradients);
  } catch (...) {
    for (float* buffer : {shard_grads_, m_, v_, embedding_scratch_, block_scratch_}) backend_.release(buffer);
    throw;
  }
  backend_.fill_zero(shard_grads_, shard);
  backend_.fill_zero(m_, shard);
  backend_.fill_zero(v_, shard);
  buckets_.resize(plan_.buckets.size());
}

Zero2Strategy::FixedSizes Zero2Strategy::fixed_sizes(const BucketPlan& plan, const ParameterLayout& layout) {
  FixedSizes sizes;
  sizes.shard_elems = plan.shard_elems();
  // The buckets below the embeddings' end, rounded up to whole chunks (the plan's region
  // finished last), are staged in the embedding scratch itself, which covers them whole:
  // backward's largest tensor needs no copy, and collectives run on that scratch.
  const Segment& embeddings = layout.segments[layout.embedding_segment()];
  SCALESTUDY_CHECK(embeddings.begin_elems == 0, "zero2 expects the embeddings first in the buffer");
  const size_t embeddings_chunk_end = plan.round_up_to_chunks(embeddings.end_elems);
  int staged = 0;
  const int buckets = static_cast<int>(plan.buckets.size());
  while (staged < buckets && plan.buckets[staged].end_elems <= embeddings_chunk_end) ++staged;
  // Without the region, the embeddings end in a bucket that block 0 shares: scratch as usual.
  if (staged > 0 && plan.buckets[staged - 1].end_elems >= embeddings.end_elems)
    sizes.embedding_staged_buckets = staged;
  sizes.embedding_scratch_elems = sizes.embedding_staged_buckets > 0
                                      ? plan.buckets[sizes.embedding_staged_buckets - 1].end_elems
                                      : embeddings.elems();
  for (size_t s = 1; s < layout.segments.size(); ++s)
    sizes.block_scratch_elems = std::max(sizes.block_scratch_elems, layout.segments[s].elems());
  return sizes;
}

// A bucket's staging is taken while backward fills it (at most kMaxBucketsFilled: a
// segment over more goes through scratch) and held until its reduction completes: at most
// kMaxBucketsInFlight in flight, and one more for the moment before the oldest is waited
// for. With --overlap-after, the report of backward that ends the hold (the first whose
// gradients are final below hold_until_elems) starts every bucket above where it begins,
// and those count on top of the bound for the rest of the micro-batch. With several
// micro-batches, the last buckets one of them started may still be in flight while the
// next holds its top buckets again, until its first reduction waits for them. A receive
// buffer is held from a reduction's start to its end, after the first micro-batch only.
Zero2Strategy::PoolBounds Zero2Strategy::pool_bounds(const StrategyMemoryInputs& in, int embedding_staged_buckets) {
  size_t released = 0;
  if (in.config.overlap && in.config.overlap_after > 0) {
    const size_t hold_until = hold_until_elems(in.config.overlap_after, in.plan);
    // Where that report begins: a segment's start, or, within the embeddings, which
    // backward reports in parts of its own choosing, at most their start.
    size_t release_from = 0;
    for (size_t s = 1; s < in.layout.segments.size(); ++s)
      if (in.layout.segments[s].begin_elems <= hold_until)
        release_from = std::max(release_from, in.layout.segments[s].begin_elems);
    for (const Bucket& bucket : in.plan.buckets) released += bucket.end_elems > release_from;
  }
  const size_t pooled = in.plan.buckets.size() - static_cast<size_t>(embedding_staged_buckets);
  const size_t in_flight = kMaxBucketsInFlight + 1 + released;
  const bool accumulating = in.micro_batches > 1;
  PoolBounds bounds;
  bounds.staging = std::min(pooled, kMaxBucketsFilled + in_flight + (accumulating ? released : 0));
  bounds.received = accumulating ? std::min(in.plan.buckets.size(), in_flight + 1) : 0;
  return bounds;
}

MemoryEstimate Zero2Strategy::planned_memory(const StrategyMemoryInputs& in) {
  const FixedSizes sizes = fixed_sizes(in.plan, in.layout);
  const PoolBounds pools = pool_bounds(in, sizes.embedding_staged_buckets);
  const Backend& backend = in.backend;
  const size_t chunk_elems = in.plan.bucket_elems / static_cast<size_t>(in.plan.world_size);
  MemoryEstimate estimate;
  estimate[MemoryKind::gradients] = backend.floats_bytes(sizes.shard_elems, MemoryKind::gradients) +
                                    backend.floats_bytes(sizes.embedding_scratch_elems, MemoryKind::gradients) +
                                    backend.floats_bytes(sizes.block_scratch_elems, MemoryKind::gradients);
  estimate[MemoryKind::optimizer] = 2 * backend.floats_bytes(sizes.shard_elems, MemoryKind::optimizer);
  // The backend's AdamW table of each distinct list of pieces of this rank's chunks
  // (optimizer_step updates one chunk at a time).
  std::vector<std::vector<AdamWPiece>> tables;
  for (int b = 0; b < static_cast<int>(in.plan.buckets.size()); ++b) {
    const size_t begin = in.plan.chunk_begin(b, in.comm.rank());
    std::vector<AdamWPiece> pieces =
        adamw_pieces(in.layout, begin, begin + in.plan.chunk_elems(b), in.config.adamw.weight_decay);
    if (std::find(tables.begin(), tables.end(), pieces) != tables.end()) continue;
    estimate[MemoryKind::optimizer] += backend.adamw_pieces_bytes(pieces);
    tables.push_back(std::move(pieces));
  }
  estimate[MemoryKind::communication] =
      pools.staging * backend.floats_bytes(in.plan.bucket_elems, MemoryKind::communication) +
      pools.received * backend.floats_bytes(chunk_elems, MemoryKind::communication) +
      in.comm.staging_bytes_for(CollectiveKind::reduce_scatter, chunk_elems, gradient_wire(in.config));
  return estimate;
}

Zero2Strategy::~Zero2Strategy() {
  comm_.finish_all();
  for (float* buffer : all_buffers_) backend_.release(buffer);
  for (float* buffer : {shard_grads_, m_, v_, embedding_scratch_, block_scratch_}) backend_.release(buffer);
}

float* Zero2Strategy::acquire_buffer(std::vector<float*>& pool, size_t elems) {
  if (!pool.empty()) {
    float* buffer = pool.back();
    pool.pop_back();
    return buffer;
  }
  // Every buffer of a pool is sized for the largest bucket (or chunk), so any can be reused.
  float* buffer = backend_.allocate_floats(elems, MemoryKind::communication);
  all_buffers_.push_back(buffer);
  comm_buffer_bytes_ += elems * sizeof(float);
  return buffer;
}

bool Zero2Strategy::overlaps(int bucket, size_t begin, size_t end) const {
  return plan_.buckets[bucket].begin_elems < end && begin < plan_.buckets[bucket].end_elems;
}

void Zero2Strategy::begin_step() {
  // With overlap, forward runs beside the parameter allgathers, yet its GEMMs keep every
  // multiprocessor: held back for the gathers' lane, GPT-2 small's 2-GPU step was slower.
  // Backward's are held back from the first reduce-scatter on (start_reduce).
  if (gather_pending_) start_gathers();
}

void Zero2Strategy::begin_micro_batch(int micro_batch, int /*micro_batches*/) {
  // Unlike ddp there is no full gradient to accumulate into: every micro-batch's buckets
  // are reduce-scattered. The first micro-batch's land in the shard itself, which they
  // cover whole, and later ones are added to it.
  first_micro_batch_ = micro_batch == 0;
  next_bucket_ = static_cast<int>(plan_.buckets.size()) - 1;
  released_ = 0;
}

void Zero2Strategy::zero_bucket_padding(int b, float* staging) {
  // Backward's segments cover every parameter, so only the padding beyond the last one
  // is never written.
  const Bucket& bucket = plan_.buckets[b];
  const size_t padding_from = std::max(bucket.begin_elems, plan_.param_elems);
  if (padding_from < bucket.end_elems)
    backend_.fill_zero(staging + (padding_from - bucket.begin_elems), bucket.end_elems - padding_from);
}

int Zero2Strategy::bucket_of(size_t elem) const {
  const auto after = std::upper_bound(plan_.buckets.begin(), plan_.buckets.end(), elem,
                                      [](size_t e, const Bucket& bucket) { return e < bucket.begin_elems; });
  return static_cast<int>(after - plan_.buckets.begin()) - 1;
}

float* Zero2Strategy::staging_for(int b) {
  BucketState& state = buckets_[b];
  // The previous micro-batch's reduction of this bucket still reads its staging.
  if (state.reducing) complete_reduce(b);
  if (!state.staging) {
    state.staging = b < embedding_staged_buckets_ ? embedding_scratch_ + plan_.buckets[b].begin_elems
                                                  : acquire_buffer(free_staging_, plan_.bucket_elems);
    zero_bucket_padding(b, state.staging);
  }
  return state.staging;
}

void Zero2Strategy::begin_segment(int segment) {
  const ParameterLayout& layout = model_.layout();
  const Segment& seg = layout.segments[segment];
  float* scratch = segment == layout.embedding_segment() ? embedding_scratch_ : block_scratch_;
  if (segment == layout.embedding_segment() && embedding_staged_buckets_ > 0) {
    // Staged in the scratch: the part above the embeddings is block 0's, written already.
    for (int b = 0; b < embedding_staged_buckets_; ++b) staging_for(b);
    backend_.fill_zero(embedding_scratch_, seg.elems());
    return;
  }
  if (bucket_of(seg.end_elems - 1) - bucket_of(seg.begin_elems) >= static_cast<int>(kMaxBucketsFilled)) {
    // Written straight into staging, a segment over more buckets would hold them all.
    backend_.fill_zero(scratch, seg.elems());
    scratch_ranges_.push_back({segment, seg.begin_elems, seg.end_elems, scratch});
    return;
  }
  // A tensor that lies in one bucket is written straight into that bucket's staging. One
  // that crosses a bucket's edge is written into scratch, and copied into the staging of
  // its buckets when backward reports it done.
  size_t direct_from = seg.end_elems;  // the direct tensors above, not zeroed yet
  auto zero_direct_below = [&](size_t direct_to) {
    // Zeroed one bucket at a time: a bucket's staging is contiguous, two buckets' are not.
    for (size_t end = direct_from; end > direct_to;) {
      const int b = bucket_of(end - 1);
      const size_t begin = std::max(direct_to, plan_.buckets[b].begin_elems);
      backend_.fill_zero(staging_for(b) + (begin - plan_.buckets[b].begin_elems), end - begin);
      end = begin;
    }
  };
  // From the segment's end down, as backward finishes it, so staging is taken in that order.
  for (auto tensor = layout.tensors.rbegin(); tensor != layout.tensors.rend(); ++tensor) {
    if (tensor->segment != segment) continue;
    const size_t begin = tensor->offset_elems, end = begin + tensor->elems;
    if (bucket_of(begin) == bucket_of(end - 1)) continue;
    zero_direct_below(end);
    float* tensor_scratch = scratch + (begin - seg.begin_elems);
    backend_.fill_zero(tensor_scratch, tensor->elems);
    scratch_ranges_.push_back({segment, begin, end, tensor_scratch});
    direct_from = begin;
  }
  zero_direct_below(seg.begin_elems);
}

float* Zero2Strategy::tensor_gradients(size_t tensor_begin_elems) {
  for (const ScratchRange& range : scratch_ranges_)
    if (range.begin_elems <= tensor_begin_elems && tensor_begin_elems < range.end_elems)
      return range.scratch + (tensor_begin_elems - range.begin_elems);
  const int b = bucket_of(tensor_begin_elems);
  SCALESTUDY_CHECK(buckets_[b].staging != nullptr, "tensor_gradients: the tensor's segment was not begun");
  return buckets_[b].staging + (tensor_begin_elems - plan_.buckets[b].begin_elems);
}

std::vector<size_t> Zero2Strategy::segment_cuts(int segment) const {
  return bucket_cuts(plan_, model_.layout().segments[segment]);
}

void Zero2Strategy::segment_done_from(int segment, size_t offset_elems) {
  const ParameterLayout& layout = model_.layout();
  const Segment& seg = layout.segments[segment];
  // The part reported now: from offset_elems up to where the segment's last report began.
  const size_t lo = seg.begin_elems + offset_elems;
  const size_t hi = segment == reported_segment_ ? reported_from_elems_ : seg.end_elems;
  SCALESTUDY_CHECK(lo < hi, "segment parts must be reported from the segment's end down");
  reported_segment_ = offset_elems == 0 ? -1 : segment;
  reported_from_elems_ = lo;
  // The buckets held so far all start in this report, beside each other. Bounded by
  // kMaxBucketsInFlight alone, the next bucket would make backward wait for all but two of
  // them; so for the rest of this micro-batch the bound counts them on top (their staging
  // is taken already).
  const bool releasing_held = lo <= hold_until_elems_ && hi > hold_until_elems_ && config_.overlap_after > 0;
  // Without overlap each reduction is waited for at once.
  LaneScope lane(comm_, config_.overlap ? lane_after_segment(layout, segment, offset_elems) : CommLane::awaited);
  // From the top bucket down, so each bucket that this part completes is started before
  // the next one is staged: staging never holds more than the buckets in flight and the
  // ones being filled.
  for (int b = static_cast<int>(plan_.buckets.size()) - 1; b >= 0; --b) {
    const Bucket& bucket = plan_.buckets[b];
    for (const ScratchRange& range : scratch_ranges_) {
      const size_t from = std::max({lo, bucket.begin_elems, range.begin_elems});
      const size_t to = std::min({hi, bucket.end_elems, range.end_elems});
      if (from < to)
        backend_.copy(staging_for(b) + (from - bucket.begin_elems), range.scratch + (from - range.begin_elems),
                  to - from);
    }
    // Gradients finish from the end of the buffer down: everything from here up is final.
    // Until backward has finished the --overlap-after share, final buckets wait in their
    // staging; the report that finishes it starts them all, from the top down.
    if (b == next_bucket_ && bucket.begin_elems >= lo && lo <= hold_until_elems_) {
      if (releasing_held) ++released_;
      start_reduce(b);
      --next_bucket_;
    }
  }
  if (offset_elems == 0)
    scratch_ranges_.erase(std::remove_if(scratch_ranges_.begin(), scratch_ranges_.end(),
                                         [segment](const ScratchRange& r) { return r.segment == segment; }),
                          scratch_ranges_.end());
}

void Zero2Strategy::start_reduce(int b) {
  BucketState& state = buckets_[b];
  staging_for(b);  // taken here for a bucket of padding only
  // The first micro-batch's reduced chunk is the shard's; later ones are added to it.
  float* shard_chunk = shard_grads_ + plan_.shard_offset(b);
  state.received =
      first_micro_batch_ ? nullptr : acquire_buffer(free_received_, plan_.bucket_elems / plan_.world_size);
  float* destination = state.received ? state.received : shard_chunk;
  if (config_.overlap) reserve_for_overlapped_lane(backend_, comm_, true);
  const size_t chunk_elems = plan_.chunk_elems(b);
  state.reduce = comm_.start_reduce_scatter(
      collective_args(state.staging, destination, chunk_elems, "grad-comm", gradient_wire(config_)));
  state.reducing = true;
  reducing_.push_back(b);
  if (!config_.overlap) {
    complete_reduce(b);
    return;
  }
  while (reducing_.size() > kMaxBucketsInFlight + released_) complete_reduce(reducing_.front());
}

void Zero2Strategy::complete_reduce(int b) {
  BucketState& state = buckets_[b];
  comm_.finish(state.reduce);
  if (state.received) {
    backend_.accumulate(shard_grads_ + plan_.shard_offset(b), state.received, plan_.chunk_elems(b));
    free_received_.push_back(state.received);
  }
  if (b >= embedding_staged_buckets_) free_staging_.push_back(state.staging);
  state.staging = state.received = nullptr;
  state.reducing = false;
  reducing_.erase(std::find(reducing_.begin(), reducing_.end(), b));
}

void Zero2Strategy::finish_gradient_sync() {
  SCALESTUDY_CHECK(next_bucket_ < 0, "backward ended with buckets never reduced");
  // The latest one's wait covers the rest (Communicator::finish).
  if (!reducing_.empty()) comm_.finish(buckets_[reducing_.back()].reduce);
  while (!reducing_.empty()) complete_reduce(reducing_.front());
  reserve_for_overlapped_lane(backend_, comm_, false);
}

OptimizerStats Zero2Strategy::optimizer_step(float learning_rate, int adam_step, float grad_scale) {
  // Leftover gathers of padding-only buckets, which no forward segment waits for.
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    if (buckets_[b].gathering) complete_gather(b);

  double sum_of_squares = backend_.sum_of_squares(shard_grads_, plan_.shard_elems());
  comm_.allreduce(&sum_of_squares, 1, "optimizer");
  // Every rank sees the same global norm, so every rank skips (or not) alike.
  const OptimizerStats stats = unscale_and_clip(std::sqrt(sum_of_squares), grad_scale, config_.grad_clip);
  if (stats.skipped) return stats;
  if (stats.clip_factor != 1.0f) backend_.scale(shard_grads_, plan_.shard_elems(), stats.clip_factor);

  for (int b = 0; b < static_cast<int>(plan_.buckets.size()); ++b) {
    const size_t begin = plan_.chunk_begin(b, rank_), offset = plan_.shard_offset(b);
    const size_t chunk = plan_.chunk_elems(b);
    // The master weights are this rank's chunks of the fp32 parameters, which the
    // allgathers leave as they are.
    own_chunks_refreshed_ =
        adamw_over_range(backend_, model_.layout(), begin, begin + chunk,
                         {.params = model_.params() + begin, .grads = shard_grads_ + offset,
                          .m = m_ + offset, .v = v_ + offset},
                         adamw_params(config_.adamw, learning_rate, adam_step));
  }
  gather_pending_ = true;
  if (!config_.overlap) sync_forward_parameters();
  return stats;
}

void Zero2Strategy::start_gathers() {
  // Forward reads the embeddings and block 0 at once; the later blocks' buckets it reads
  // after whole blocks of forward, which hide them.
  const ParameterLayout& layout = model_.layout();
  const size_t hidden_from = layout.shape.layers > 1 ? layout.segments[layout.block_segment(1)].begin_elems
                                                     : plan_.padded_elems;
  // In bucket order, which is the order forward reads them.
  for (int b = 0; b < static_cast<int>(plan_.buckets.size()); ++b) {
    const bool hidden = config_.overlap && plan_.buckets[b].begin_elems >= hidden_from;
    LaneScope lane(comm_, hidden ? CommLane::overlapped : CommLane::awaited);
    const size_t own_begin = plan_.chunk_begin(b, rank_), chunk = plan_.chunk_elems(b);
    const size_t bucket_begin = plan_.buckets[b].begin_elems;
    if (compute_copy_) {
      if (!own_chunks_refreshed_) backend_.parameters_changed(model_.params(), own_begin, own_begin + chunk);
      buckets_[b].gather = comm_.start_allgather(
          collective_args(compute_copy_ + own_begin, compute_copy_ + bucket_begin, chunk, "param-gather"));
    } else {
      buckets_[b].gather = comm_.start_allgather(
          collective_args(model_.params() + own_begin, model_.params() + bucket_begin, chunk, "param-gather"));
    }
    buckets_[b].gathering = true;
  }
  gather_pending_ = false;
  masters_behind_ = masters_behind_ || compute_copy_ != nullptr;
}

void Zero2Strategy::complete_gather(int b) {
  comm_.finish(buckets_[b].gather);
  buckets_[b].gathering = false;
  // A gathered copy is what the ops read already.
  if (compute_copy_) return;
  // In stream order after the wait: a lower-precision compute copy sees the new values.
  // Where AdamW refreshed this rank's chunk already, only the other ranks' chunks are new.
  const Bucket& bucket = plan_.buckets[b];
  if (!own_chunks_refreshed_) {
    backend_.parameters_changed(model_.params(), bucket.begin_elems, bucket.end_elems);
    return;
  }
  const size_t own_begin = plan_.chunk_begin(b, rank_), own_end = own_begin + plan_.chunk_elems(b);
  backend_.parameters_changed(model_.params(), bucket.begin_elems, own_begin);
  backend_.parameters_changed(model_.params(), own_end, bucket.end_elems);
}

void Zero2Strategy::before_segment_forward(int segment) {
  const Segment& seg = model_.layout().segments[segment];
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    if (buckets_[b].gathering && overlaps(b, seg.begin_elems, seg.end_elems)) complete_gather(b);
  // A later micro-batch's forward follows the reduce-scatters of the one before; once they
  // are done, its GEMMs take the whole GPU again.
  if (config_.overlap && reducing_.empty()) reserve_for_overlapped_lane(backend_, comm_, false);
}

void Zero2Strategy::sync_forward_parameters() {
  if (gather_pending_) start_gathers();
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    if (buckets_[b].gathering) complete_gather(b);
}

void Zero2Strategy::finish_param_sync() {
  sync_forward_parameters();
  if (!masters_behind_) return;
  // Each rank's fp32 chunks are its masters, as current as the copy; the whole parameters
  // are read only from here on (results, tests), so they are gathered once, now.
  CommHandle last{};
  for (int b = 0; b < static_cast<int>(plan_.buckets.size()); ++b)
    last = comm_.start_allgather(collective_args(model_.params() + plan_.chunk_begin(b, rank_),
                                                 model_.params() + plan_.buckets[b].begin_elems,
                                                 plan_.chunk_elems(b), "param-gather"));
  comm_.finish(last);  // the latest covers the earlier ones (Communicator::finish)
  masters_behind_ = false;
}

StrategyMemory Zero2Strategy::memory() const {
  StrategyMemory memory;
  memory.gradient_bytes = (plan_.shard_elems() + embedding_scratch_elems_ + block_scratch_elems_) * sizeof(float);
  memory.optimizer_bytes = 2 * plan_.shard_elems() * sizeof(float);
  memory.communication_bytes = comm_buffer_bytes_;
  return memory;
}

}  // namespace scalestudy
