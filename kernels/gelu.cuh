#pragma once
// GELU with the tanh approximation that GPT-2 was trained with, elementwise, in fp32, bf16
// or fp16 storage (fp32 arithmetic either way).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

void launch_gelu_forward(cudaStream_t stream, float* out, const float* inp, size_t elems);
void launch_gelu_forward(cudaStream_t stream, __nv_bfloat16* out, const __nv_bfloat16* inp,
                         size_t elems);
void launch_gelu_forward(cudaStream_t stream, __half* out, const __half* inp, size_t elems);
// dinp += gelu'(inp) * dout.
void launch_gelu_backward(cudaStream_t stream, float* dinp, const float* inp, const float* dout,
                          size_t elems, bool accumulate_dinp);
void launch_gelu_backward(cudaStream_t stream, __nv_bfloat16* dinp, const __nv_bfloat16* inp,
                          const __nv_bfloat16* dout, size_t elems, bool accumulate_dinp);
void launch_gelu_backward(cudaStream_t stream, __half* dinp, const __half* inp,
                          const __half* dout, size_t elems, bool accumulate_dinp);

}  // namespace scalestudy::cuda
