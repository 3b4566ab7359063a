#pragma once
// GELU with the tanh approximation that GPT-2 was trained with, elementwise, in fp32, bf16
// or fp16 storage (fp32 arithmetic either way).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

// T is float, __nv_bfloat16 or __half.
template <class T>
void launch_gelu_forward(cudaStream_t stream, T* out, const T* inp, size_t elems);
// dinp += gelu'(inp) * dout, or dinp = gelu'(inp) * dout without accumulate_dinp.
template <class T>
void launch_gelu_backward(cudaStream_t stream, T* dinp, const T* inp, const T* dout, size_t elems,
                          bool accumulate_dinp);

}  // namespace scalestudy::cuda
