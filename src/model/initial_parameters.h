#pragma once
// The model's starting weights, the same on every rank and every backend.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/parameter_layout.h"

namespace scalestudy {

// GPT-2 initialisation from a seed, as a host buffer of padded_elems floats: weights
// N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), biases and padding 0, LayerNorm
// weights 1. The normal draws come from a generator defined here rather than from
// <random>, whose distributions differ between standard libraries.
std::vector<float> initial_parameters(const ParameterLayout& layout, size_t padded_elems, uint64_t seed);

}  // namespace scalestudy
