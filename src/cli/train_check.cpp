#include "cli/train_check.h"

#include <cstdio>

#include "model/parameter_layout.h"
#include "parallel/bucket_plan.h"
#include "train/trainer.h"

namespace scalestudy {

int run_train_check(RunConfig config) {
  RunConfig& c = config;
  resolve_for_world(c, c.check_ranks);
  make_checked_token_source(c);
  const ParameterLayout layout = make_parameter_layout(c.shape);
  const BucketPlan plan = make_bucket_plan(layout.param_elems, c.data_parallel().bucket_bytes, c.world_size,
                                           layout.segments[layout.embedding_segment()].end_elems);
  std::printf("scalestudy train --check: valid on %d rank(s): model %s, %zu parameters in %zu bucket(s), backend %s "
              "%s, %s scaling, global batch %d = %d rank(s) x %d in %d micro-batch(es), seq %d, %d steps\n",
              c.world_size, c.model.c_str(), layout.param_elems, plan.buckets.size(), c.backend.c_str(),
              precision_name(c.precision), scaling_name(c.scaling), c.global_batch, c.world_size, c.batch_per_rank,
              c.grad_accum, c.seq, c.steps);
  return 0;
}

}  // namespace scalestudy
