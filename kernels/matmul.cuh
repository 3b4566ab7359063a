#pragma once
// The dense layer out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC], as an fp32 cuBLAS
// GEMM plus a bias kernel; backward as two accumulating GEMMs and a deterministic
// column reduction for the bias.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

// bias may be null (the tied LM head has none). handle must be bound to stream.
void launch_matmul_forward(cublasHandle_t handle, cudaStream_t stream, float* out,
                           const float* inp, const float* weight, const float* bias, int rows,
                           int in_channels, int out_channels);

// Floats of scratch that launch_matmul_backward needs (for the bias reduction).
size_t matmul_backward_scratch_elems(int rows, int out_channels);
// dinp += dout @ weight; dweight += dout^T @ inp; dbias += column sums of dout (dbias
// may be null, and then nothing is reduced).
void launch_matmul_backward(cublasHandle_t handle, cudaStream_t stream, float* dinp,
                            float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int rows, int in_channels, int out_channels,
                            float* scratch, size_t scratch_elems);

}  // namespace scalestudy::cuda
