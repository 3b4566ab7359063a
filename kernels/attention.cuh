#pragma once
// Multi-head attention in its plain form: scores and outputs through cuBLAS
// strided-batched GEMMs that read Q, K and V straight out of qkv[B,T,3C] (no permute),
// and the softmax, causal mask and softmax backward in row kernels. In bf16 (fp16), qkv,
// out, probs and the gradients are bf16 (fp16) while the scores and their gradient are
// fp32 (in scratch), so the softmax and its backward work on unrounded GEMM results. The
// 16-bit launchers of both types share their scratch sizes (the _16bit functions).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "op_params.h"
#include "scratch.cuh"

namespace scalestudy::cuda {

// out[B,T,C]; probs[B,NH,T,T] holds the softmax, with masked entries exactly 0. handle
// must be bound to stream. fp32 computes the scores in probs itself.
void launch_attention_forward(cublasHandle_t handle, cudaStream_t stream, float* out,
                              float* probs, const float* qkv, const AttentionShape& shape);
// Floats of scratch the bf16 and fp16 forwards need: the fp32 scores, [B,NH,T,T].
size_t attention_forward_scratch_elems_16bit(const AttentionShape& shape);
// Half is __nv_bfloat16 or __half, here and below.
template <class Half>
void launch_attention_forward(cublasHandle_t handle, cudaStream_t stream, Half* out, Half* probs,
                              const Half* qkv, const AttentionShape& shape, Scratch scratch);

// Floats of scratch that the fp32 launch_attention_backward needs: one [B,NH,T,T]
// buffer for the gradient of the probabilities, turned in place into the gradient of
// the scores.
size_t attention_backward_scratch_elems(const AttentionShape& shape);
// dqkv[B,T,3C] += the gradients of Q, K and V (args.dqkv_write must be accumulate), from
// the probabilities in args.state; args.out is not read.
void launch_attention_backward(cublasHandle_t handle, cudaStream_t stream,
                               const AttentionBackwardArgs<float>& args, Scratch scratch);
// Floats of scratch the bf16 and fp16 backwards need: fp32 d(probs) and 16-bit d(scores),
// each [B,NH,T,T].
size_t attention_backward_scratch_elems_16bit(const AttentionShape& shape);
template <class Half>
void launch_attention_backward(cublasHandle_t handle, cudaStream_t stream,
                               const AttentionBackwardArgs<Half>& args, Scratch scratch);

}  // namespace scalestudy::cuda
