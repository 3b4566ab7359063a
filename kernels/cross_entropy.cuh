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

// The rows of a call: `rows` rows of `vocab` logits, row_stride elements apart, and each
// row's target class.
struct CrossEntropyRows {
  const int32_t* targets = nullptr;
  int rows = 0;
  int vocab = 0;
  int row_stride = 0;
};

// losses[n] = log(sum exp) + max - logits[n, target]; row_stats[2n] = the row's max,
// row_stats[2n+1] = 1 / sum(exp(logit - max)). One read of the logits.
// A target outside [0, vocab) cannot be checked on the host without a synchronisation;
// it gives a NaN loss, which the first read of the loss makes visible.
// T is float, __nv_bfloat16 or __half.
template <class T>
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const T* logits, CrossEntropyRows rows);
// dlogits[n,:] = loss_scale * (softmax(logits[n,:]) - onehot(targets[n])), the softmax
// recomputed from row_stats. Overwrites; dlogits may be logits (one read, one write).
template <class T>
void launch_softmax_cross_entropy_backward(cudaStream_t stream, T* dlogits, const T* logits,
                                           const float* row_stats, CrossEntropyRows rows,
                                           float loss_scale);

// The forward and then the backward in place, in one pass over the logits: losses and
// row_stats as the forward defines them, and the logits overwritten with dlogits, which
// are bit for bit the backward's for those row_stats. A row is read once and written once
// (two passes of the memory where the two launchers take three). The row sums are added
// in another order than the forward's, so the statistics may differ from the forward's in
// their last bits. 16-bit logits only (T is __nv_bfloat16 or __half); vocabularies past
// 102400 run the two launchers.
template <class T>
void launch_softmax_cross_entropy_forward_backward(cudaStream_t stream, float* losses,
                                                   float* row_stats, T* logits,
                                                   CrossEntropyRows rows, float loss_scale);

}  // namespace scalestudy::cuda
