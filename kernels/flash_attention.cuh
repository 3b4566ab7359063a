#pragma once
// Fused ("flash") multi-head attention for the 16-bit modes: the scores and probabilities
// live only in registers, one tile of keys at a time, so the [B,NH,T,T] matrices of the
// plain path (attention.cuh) are never written. Q, K and V are read straight out of
// qkv[B,T,3C]. Products run on the tensor cores with 16-bit operands and fp32
// accumulation; the softmax is the online one, in fp32. The forward keeps, per query
// row, the log-sum-exp of its scaled scores, from which the backward recomputes the
// probabilities instead of storing them.
//
// Deterministic: every output element is computed by one thread in a fixed order (no
// atomics), so the same inputs give the same bits on every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "op_params.h"
#include "scratch.cuh"

namespace scalestudy::cuda {

// Whether the flash kernels take this shape: head size C/NH must be 64 (GPT-2's at every
// size); other shapes go through the plain path. Any B, T >= 1 and NH.
bool flash_attention_supported(const AttentionShape& shape);

// qkv[B,T,3C] holds Q, K and V side by side per token (head h at h*HS inside each third);
// out[B,T,C]; lse[B,NH,T] (fp32) the natural-log log-sum-exp of each query row's scores
// scaled by 1/sqrt(HS), over the keys it sees (causal: keys t2 <= t). qkv and out must
// be 16-byte aligned.
// T is __nv_bfloat16 or __half, here and below.
template <class T>
void launch_flash_attention_forward(cudaStream_t stream, T* out, float* lse, const T* qkv,
                                    const AttentionShape& shape);

// Floats of scratch the backward needs: D = rowsum(dout * out), [B,NH,T].
size_t flash_attention_backward_scratch_elems(const AttentionShape& shape);

// dqkv[B,T,3C] += the gradients of Q, K and V (each element read, summed in fp32 and
// rounded once), or with GradientWrite::overwrite dqkv = them (dqkv never read), from the
// forward's out and its lse (args.state). Pointers of 16-bit tensors must be 16-byte
// aligned.
template <class T>
void launch_flash_attention_backward(cudaStream_t stream, const AttentionBackwardArgs<T, float>& args,
                                     Scratch scratch);

}  // namespace scalestudy::cuda
