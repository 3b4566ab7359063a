#pragma once
// Softmax cross-entropy over rows of V logits, each row `row_stride` elements apart
// (row_stride >= vocab; the elements past vocab are never read or written). logits and
// dlogits are fp32, bf16 or fp16 storage (fp32 arithmetic either way); losses and the
// per-row statistics are always fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace scalestudy::cuda {

// losses[n] = log(sum exp) + max - logits[n, target]; row_stats[2n] = the row's max,
// row_stats[2n+1] = 1 / sum(exp(logit - max)). One read of the logits.
// A target outside [0, vocab) cannot be checked on the host without a synchronisation;
// it gives a NaN loss, which the first read of the loss makes visible.
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const float* logits, const int32_t* targets, int rows,
                                          int vocab, int row_stride);
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const __nv_bfloat16* logits, const int32_t* targets,
                                          int rows, int vocab, int row_stride);
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const __half* logits, const int32_t* targets, int rows,
                                          int vocab, int row_stride);
// dlogits[n,:] = loss_scale * (softmax(logits[n,:]) - onehot(targets[n])), the softmax
// recomputed from row_stats. Overwrites; dlogits may be logits (one read, one write).
void launch_softmax_cross_entropy_backward(cudaStream_t stream, float* dlogits,
                                           const float* logits, const float* row_stats,
                                           const int32_t* targets, int rows, int vocab,
                                           int row_stride, float loss_scale);
void launch_softmax_cross_entropy_backward(cudaStream_t stream, __nv_bfloat16* dlogits,
                                           const __nv_bfloat16* logits, const float* row_stats,
                                           const int32_t* targets, int rows, int vocab,
                                           int row_stride, float loss_scale);
void launch_softmax_cross_entropy_backward(cudaStream_t stream, __half* dlogits,
                                           const __half* logits, const float* row_stats,
                                           const int32_t* targets, int rows, int vocab,
                                           int row_stride, float loss_scale);

// The forward and then the backward in place, in one pass over the logits: losses and
// row_stats as the forward defines them, and the logits overwritten with dlogits, which
// are bit for bit the backward's for those row_stats. A row is read once and written once
// (two passes of the memory where the two launchers take three). The row sums are added
// in another order than the forward's, so the statistics may differ from the forward's in
// their last bits. 16-bit logits only; vocabularies past 102400 run the two launchers.
void launch_softmax_cross_entropy_forward_backward(cudaStream_t stream, float* losses,
                                                   float* row_stats, __nv_bfloat16* logits,
                                                   const int32_t* targets, int rows, int vocab,
                                                   int row_stride, float loss_scale);
void launch_softmax_cross_entropy_forward_backward(cudaStream_t stream, float* losses,
                                                   float* row_stats, __half* logits,
                                                   const int32_t* targets, int rows, int vocab,
                                                   int row_stride, float loss_scale);

}  // namespace scalestudy::cuda
