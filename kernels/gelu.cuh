#pragma once
// GELU with the tanh approximation that GPT-2 was trained with, elementwise.
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

void launch_gelu_forward(cudaStream_t stream, float* out, const float* inp, size_t elems);
// dinp += gelu'(inp) * dout.
void launch_gelu_backward(cudaStream_t stream, float* dinp, const float* inp, const float* dout,
                          size_t elems);

}  // namespace scalestudy::cuda
