#pragma once
// What the data-parallel strategies read (parallel/): which strategy, when buckets are
// communicated and in what precision, and the optimizer they apply to their gradients.
// RunConfig::data_parallel() fills it from the validated options; the strategies keep
// their own copy.
#include "core/precision.h"

namespace scalestudy {

enum class Strategy { ddp, zero2 };
inline const char* strategy_name(Strategy strategy) { return strategy == Strategy::ddp ? "ddp" : "zero2"; }

// AdamW's hyper-parameters other than the learning rate, which the schedule gives each step.
struct AdamWConfig {
  float beta1 = 0.9f;          // --beta1
  float beta2 = 0.95f;         // --beta2
  float epsilon = 1e-8f;       // --eps
  float weight_decay = 0.1f;   // --weight-decay: decoupled, on matrices only
};

struct DataParallelConfig {
  Strategy strategy = Strategy::ddp;        // --strategy
  // --overlap: each bucket is communicated while backward (zero2: and forward) runs;
  // otherwise one collective follows backward.
  bool overlap = false;
  // --overlap-after, resolved for the world size: the share of the gradients, from the
  // buffer's top, that backward finishes before any bucket starts (0: none is held).
  double overlap_after = 0.0;
  // --bucket-mb in bytes: the largest bucket the plan cuts, before rounding up to whole
  // chunks (parallel/bucket_plan.h); a fraction of a MiB need not be whole bytes.
  double bucket_bytes = 50.0 * 1024 * 1024;
  Precision grad_reduce = Precision::fp32;  // --grad-reduce: fp32 or bf16 across ranks
  float grad_clip = 1.0f;                   // --grad-clip: global-norm bound; 0 turns it off
  AdamWConfig adamw;
};

}  // namespace scalestudy
