#pragma once
// FLOP accounting for the GPT-style model, in one place. The formulas are the seed
// notebook's (the Megatron-LM paper's accounting, Narayanan et al. 2021):
//   forward, per layer: 24·b·s·h² + 4·b·s²·h
//   logits:             2·b·s·h·V
//   training step:      3 × forward (4 × with activation recomputation)
// They count multiply-adds as two FLOPs and ignore the elementwise ops.
#include "model/model_shape.h"

namespace scalestudy {

double forward_flops(const ModelShape& shape, double batch, double seq);
double training_flops(const ModelShape& shape, double batch, double seq, bool recompute = false);

}  // namespace scalestudy
