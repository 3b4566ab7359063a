#pragma once
// Elementwise ops on flat buffers: the residual add (whose backward is accumulate), in
// fp32, bf16 or fp16 storage; in-place scaling and fills (fp32); and the casts between
// fp32 and the 16-bit storage types. In fp32 each is exactly one fp32 operation per
// element, so the results are bit-identical to the CPU backend's; in bf16 or fp16 the
// same fp32 operation is rounded once to the storage type, so the result is that
// rounding of the CPU's fp32 result (in fp16, +-inf beyond 65504).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

// out = a + b. out may alias a or b.
void launch_residual_forward(cudaStream_t stream, float* out, const float* a, const float* b,
                             size_t elems);
void launch_residual_forward(cudaStream_t stream, __nv_bfloat16* out, const __nv_bfloat16* a,
                             const __nv_bfloat16* b, size_t elems);
void launch_residual_forward(cudaStream_t stream, __half* out, const __half* a, const __half* b,
                             size_t elems);
// dst += src.
void launch_accumulate(cudaStream_t stream, float* dst, const float* src, size_t elems);
void launch_accumulate(cudaStream_t stream, __nv_bfloat16* dst, const __nv_bfloat16* src,
                       size_t elems);
void launch_accumulate(cudaStream_t stream, __half* dst, const __half* src, size_t elems);
// x *= factor.
void launch_scale(cudaStream_t stream, float* x, size_t elems, float factor);
// dst = value.
void launch_fill(cudaStream_t stream, float* dst, size_t elems, float value);
// dst = src converted: fp32 -> bf16 or fp16 rounds to nearest even (fp16: magnitudes from
// 65520 up become +-inf); bf16 or fp16 -> fp32 is exact. dst and src must not overlap.
void launch_cast(cudaStream_t stream, __nv_bfloat16* dst, const float* src, size_t elems);
void launch_cast(cudaStream_t stream, float* dst, const __nv_bfloat16* src, size_t elems);
void launch_cast(cudaStream_t stream, __half* dst, const float* src, size_t elems);
void launch_cast(cudaStream_t stream, float* dst, const __half* src, size_t elems);

}  // namespace scalestudy::cuda
