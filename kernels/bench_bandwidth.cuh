#pragma once
// The CUDA kernels of the benchmarks (bench_bandwidth.cu). Kept apart from the
// benchmarks' headers so that nvcc compiles no more host code than the launchers need.
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

// dst[i] = src[i] with 16-byte loads and stores (and a scalar tail); the buffers must not
// overlap and must be 16-byte aligned (cudaMalloc gives 256).
void launch_bench_copy(cudaStream_t stream, float* dst, const float* src, size_t elems);

}  // namespace scalestudy::cuda
