#pragma once
// `scalestudy bench inference`: forward-only latency (ms) and throughput (sequences/s)
// of a whole model, by default bert-base (12 layers, hidden 768, bidirectional, its
// 30522-token vocabulary), over batch × seq, 1..256 × 64..4096 by default. The position
// table is extended to the longest seq. A point is one Gpt::forward: embedding, every
// block, final LayerNorm, tied LM head and the softmax cross-entropy that Gpt::forward
// ends with. Points whose allocations would not fit are marked oom and kept.
#include "bench/bench_common.h"

namespace scalestudy {

void run_inference_bench(BenchContext& context);

}  // namespace scalestudy
