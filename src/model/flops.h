#pragma once
// FLOP accounting for the GPT-style model, in one place. The formulas are the seed
// notebook's (the Megatron-LM paper's accounting, Narayanan et al. 2021):
//   forward, per layer: 24·b·s·h² + 4·b·s²·h
//   logits:             2·b·s·h·V
//   training step:      3 × forward
// They count multiply-adds as two FLOPs and ignore the elementwise ops. With activation
// recomputation (--recompute) the blocks' forward runs once more in backward; the paper
// counts that as 4 × forward, but the logits layer is not recomputed here, so the extra
// work is recompute_flops, the blocks' forward alone (about 0.73 × forward for GPT-2
// small at seq 1024).
#include "core/model_shape.h"

namespace scalestudy {

// What recomputation adds to a step: the transformer blocks' forward.
inline double recompute_flops(const ModelShape& shape, double batch, double seq) {
  const double h = shape.channels, layers = shape.layers;
  return layers * (24.0 * batch * seq * h * h + 4.0 * batch * seq * seq * h);
}
inline double forward_flops(const ModelShape& shape, double batch, double seq) {
  return recompute_flops(shape, batch, seq) + 2.0 * batch * seq * shape.channels * shape.vocab;
}
// The model FLOPs of a step: what MFU divides, with or without recomputation.
inline double training_flops(const ModelShape& shape, double batch, double seq) {
  return 3.0 * forward_flops(shape, batch, seq);
}

}  // namespace scalestudy
