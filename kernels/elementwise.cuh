#pragma once
// Elementwise ops on flat buffers: the accumulate (dst += src; the dense layer's residual
// add where its GEMM cannot take it), in fp32, bf16 or fp16 storage; in-place scaling and
// fills (fp32); and the casts between fp32 and the 16-bit storage types. In fp32 each is
// exactly one fp32 operation per element, so the results are bit-identical to the CPU
// backend's; in bf16 or fp16 the same fp32 operation is rounded once to the storage type,
// so the result is that rounding of the CPU's fp32 result (in fp16, +-inf beyond 65504).
// Also the plain copy that `scalestudy bench bandwidth` times.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

// T is float, __nv_bfloat16 or __half, for every launcher below that takes one.
// dst += src.
template <class T>
void launch_accumulate(cudaStream_t stream, T* dst, const T* src, size_t elems);
// x *= factor.
void launch_scale(cudaStream_t stream, float* x, size_t elems, float factor);
// dst = value.
void launch_fill(cudaStream_t stream, float* dst, size_t elems, float value);
// dst = src converted: fp32 -> bf16 or fp16 rounds to nearest even (fp16: magnitudes from
// 65520 up become +-inf); bf16 or fp16 -> fp32 is exact. dst and src must not overlap.
// One of To and From is float, the other __nv_bfloat16 or __half.
template <class To, class From>
void launch_cast(cudaStream_t stream, To* dst, const From* src, size_t elems);

// dst[i] = src[i] with 16-byte loads and stores (and a scalar tail); the buffers must not
// overlap and must be 16-byte aligned (cudaMalloc gives 256).
void launch_bench_copy(cudaStream_t stream, float* dst, const float* src, size_t elems);

}  // namespace scalestudy::cuda
