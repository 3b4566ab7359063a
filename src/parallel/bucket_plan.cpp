#include "parallel/bucket_plan.h"

#include <cmath>

#include "core/check.h"

namespace scalestudy {

BucketPlan make_bucket_plan(size_t param_elems, double bucket_bytes, int world_size) {
  SCALESTUDY_CHECK(world_size > 0 && param_elems > 0 && bucket_bytes > 0, "bad bucket plan input");
  BucketPlan plan;
  plan.world_size = world_size;
  plan.param_elems = param_elems;
  const size_t granule = static_cast<size_t>(world_size) * BucketPlan::kAlignElems;
  auto round_up = [granule](size_t elems) { return (elems + granule - 1) / granule * granule; };
  plan.padded_elems = round_up(param_elems);
  const double requested = std::ceil(bucket_bytes / sizeof(float));
  size_t bucket_elems = requested >= static_cast<double>(plan.padded_elems)
                            ? plan.padded_elems
                            : round_up(static_cast<size_t>(requested));
  plan.bucket_elems = bucket_elems;
  for (size_t begin = 0; begin < plan.padded_elems; begin += bucket_elems) {
    const size_t end = begin + bucket_elems < plan.padded_elems ? begin + bucket_elems : plan.padded_elems;
    plan.buckets.push_back({begin, end});
  }
  return plan;
}

}  // namespace scalestudy
