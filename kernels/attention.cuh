#pragma once
// Multi-head attention in its plain form: scores and outputs through fp32 cuBLAS
// strided-batched GEMMs that read Q, K and V straight out of qkv[B,T,3C] (no permute),
// and the softmax, causal mask and softmax backward in row kernels.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "backend/ops.h"

namespace scalestudy::cuda {

// out[B,T,C]; probs[B,NH,T,T] holds the softmax, with masked entries exactly 0. handle
// must be bound to stream.
void launch_attention_forward(cublasHandle_t handle, cudaStream_t stream, float* out,
                              float* probs, const float* qkv, const AttentionShape& shape);

// Floats of scratch that launch_attention_backward needs: one [B,NH,T,T] buffer for the
// gradient of the probabilities, turned in place into the gradient of the scores.
size_t attention_backward_scratch_elems(const AttentionShape& shape);
// dqkv[B,T,3C] += the gradients of Q, K and V.
void launch_attention_backward(cublasHandle_t handle, cudaStream_t stream, float* dqkv,
                               const float* dout, const float* qkv, const float* probs,
                               const AttentionShape& shape, float* scratch,
                               size_t scratch_elems);

}  // namespace scalestudy::cuda
