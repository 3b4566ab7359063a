#include "parallel/bucket_plan.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace scalestudy {

BucketPlan make_bucket_plan(size_t param_elems, double bucket_bytes, int world_size,
                            size_t last_finished_elems) {
  SCALESTUDY_CHECK(world_size > 0 && param_elems > 0 && bucket_bytes > 0 &&
                       last_finished_elems <= param_elems,
                   "bad bucket plan input");
  BucketPlan plan;
  plan.world_size = world_size;
  plan.param_elems = param_elems;
  const size_t granule = static_cast<size_t>(world_size) * BucketPlan::kAlignElems;
  auto round_up = [&plan](size_t elems) { return plan.round_up_to_chunks(elems); };
  plan.padded_elems = round_up(param_elems);
  const double requested = std::ceil(bucket_bytes / sizeof(float));
  const size_t bucket_elems = requested >= static_cast<double>(plan.padded_elems)
                                  ? plan.padded_elems
                                  : round_up(static_cast<size_t>(requested));
  // The region finished last, in equal buckets of whole chunks (their sizes differ by one
  // chunk at most), none larger than bucket_elems.
  const size_t region_end = round_up(last_finished_elems);
  const size_t region_chunks = region_end / granule;
  const size_t pieces = (region_end + bucket_elems - 1) / bucket_elems;
  for (size_t piece = 0; piece < pieces; ++piece)
    plan.buckets.push_back({region_chunks * piece / pieces * granule,
                            region_chunks * (piece + 1) / pieces * granule});
  // The rest from the buffer's end, where backward starts, down: the shorter bucket is
  // the lowest, the one started last, that backward's remaining compute hides least.
  std::vector<Bucket> above;
  for (size_t end = plan.padded_elems; end > region_end;) {
    const size_t begin = end - region_end > bucket_elems ? end - bucket_elems : region_end;
    above.push_back({begin, end});
    end = begin;
  }
  plan.buckets.insert(plan.buckets.end(), above.rbegin(), above.rend());
  for (const Bucket& bucket : plan.buckets) plan.bucket_elems = std::max(plan.bucket_elems, bucket.elems());
  return plan;
}

}  // namespace scalestudy
