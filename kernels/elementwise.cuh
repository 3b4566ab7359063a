#pragma once
// Elementwise ops on flat fp32 buffers: the residual add (whose backward is accumulate),
// in-place scaling, and fills. Each is exactly one fp32 operation per element, so the
// results are bit-identical to the CPU backend's.
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

// out = a + b. out may alias a or b.
void launch_residual_forward(cudaStream_t stream, float* out, const float* a, const float* b,
                             size_t elems);
// dst += src.
void launch_accumulate(cudaStream_t stream, float* dst, const float* src, size_t elems);
// x *= factor.
void launch_scale(cudaStream_t stream, float* x, size_t elems, float factor);
// dst = value.
void launch_fill(cudaStream_t stream, float* dst, size_t elems, float value);

}  // namespace scalestudy::cuda
