#pragma once
// Softmax cross-entropy over rows of V logits. logits, probs and dlogits are fp32, bf16 or
// fp16 storage (fp32 arithmetic either way); losses are always fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace scalestudy::cuda {

// probs[n,:] = softmax(logits[n,:]); losses[n] = log(sum exp) + max - logits[n, target].
// A target outside [0, vocab) cannot be checked on the host without a synchronisation;
// it gives a NaN loss, which the first read of the loss makes visible.
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* probs,
                                          const float* logits, const int32_t* targets, int rows,
                                          int vocab);
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses,
                                          __nv_bfloat16* probs, const __nv_bfloat16* logits,
                                          const int32_t* targets, int rows, int vocab);
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, __half* probs,
                                          const __half* logits, const int32_t* targets, int rows,
                                          int vocab);
// dlogits[n,:] += loss_scale * (probs[n,:] - onehot(targets[n])).
void launch_softmax_cross_entropy_backward(cudaStream_t stream, float* dlogits,
                                           const float* probs, const int32_t* targets, int rows,
                                           int vocab, float loss_scale);
void launch_softmax_cross_entropy_backward(cudaStream_t stream, __nv_bfloat16* dlogits,
                                           const __nv_bfloat16* probs, const int32_t* targets,
                                           int rows, int vocab, float loss_scale);
void launch_softmax_cross_entropy_backward(cudaStream_t stream, __half* dlogits,
                                           const __half* probs, const int32_t* targets, int rows,
                                           int vocab, float loss_scale);

}  // namespace scalestudy::cuda
