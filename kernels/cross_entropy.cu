#include "cross_entropy.cuh"

#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// A GPT-2 row is 50257 logits: 512 threads give each about a hundred.
constexpr int kRowThreads = 512;

// T is the storage of logits and dlogits (fp32, bf16 or fp16); losses and row_stats are
// fp32. Not __restrict__: dlogits may be logits.
template <class T>
struct CrossEntropyForwardParams {
  float* losses;
  float* row_stats;
  const T* logits;
  const int32_t* targets;
  int vocab;
  int row_stride;
};

template <class T>
struct CrossEntropyBackwardParams {
  T* dlogits;
  const T* logits;
  const float* row_stats;
  const int32_t* targets;
  int vocab;
  int row_stride;
  float loss_scale;
};

// A row's elements split for 16-byte accesses: `head` single elements up to the first
// 16-byte boundary, `packs` whole packs, then single elements to the end. Rows of an odd
// vocabulary start at every alignment, so each row computes its own split; two rows that
// are read or written together use packs only where they share their alignment.
struct RowSplit {
  int head;
  int packs;
};

template <class T>
__device__ RowSplit split_row(const T* row, const T* other, int count) {
  const auto offset = reinterpret_cast<uintptr_t>(row) % 16;
  if (offset != reinterpret_cast<uintptr_t>(other) % 16 || offset % sizeof(T) != 0)
    return RowSplit{count, 0};
  const int head = min(count, offset == 0 ? 0 : static_cast<int>((16 - offset) / sizeof(T)));
  return RowSplit{head, (count - head) / Pack<T>::kCount};
}

// Calls visit(v, value) once for every element v of the row, spread over the block.
template <class T, class Visit>
__device__ void for_each_in_row(const T* row, RowSplit split, int count, Visit visit) {
  constexpr int kCount = Pack<T>::kCount;
  for (int v = threadIdx.x; v < split.head; v += blockDim.x) visit(v, to_float(row[v]));
  for (int p = threadIdx.x; p < split.packs; p += blockDim.x) {
    const int first = split.head + p * kCount;
    const Pack<T> pack = load_pack(row + first);
#pragma unroll
    for (int k = 0; k < kCount; ++k) visit(first + k, pack.get(k));
  }
  for (int v = split.head + split.packs * kCount + threadIdx.x; v < count; v += blockDim.x)
    visit(v, to_float(row[v]));
}

// out[v] = from_float(f(v, in[v])) for every element of two rows with one split. out may
// be in: each element is read and written by the same thread.
template <class T, class F>
__device__ void update_row(T* out, const T* in, RowSplit split, int count, F f) {
  constexpr int kCount = Pack<T>::kCount;
  for (int v = threadIdx.x; v < split.head; v += blockDim.x)
    out[v] = from_float<T>(f(v, to_float(in[v])));
  for (int p = threadIdx.x; p < split.packs; p += blockDim.x) {
    const int first = split.head + p * kCount;
    const Pack<T> source = load_pack(in + first);
    Pack<T> target;
#pragma unroll
    for (int k = 0; k < kCount; ++k) target.set(k, f(first + k, source.get(k)));
    store_pack(out + first, target);
  }
  for (int v = split.head + split.packs * kCount + threadIdx.x; v < count; v += blockDim.x)
    out[v] = from_float<T>(f(v, to_float(in[v])));
}

// One block per row, one pass over the logits: each thread keeps the sum of exp(x - m)
// for its own running max m, rescaled when m grows, and the block combines them after
// reducing the max; every exponent is <= 0, and the sums are in double, as on the CPU.
// The loss comes from this log-sum-exp, never from a stored probability.
template <class T>
__global__ void cross_entropy_forward_kernel(CrossEntropyForwardParams<T> p) {
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  const int row = blockIdx.x;
  const T* x = p.logits + size_t(row) * p.row_stride;
  const RowSplit split = split_row(x, x, p.vocab);
  float thread_max = -INFINITY;
  double thread_total = 0.0;
  for_each_in_row(x, split, p.vocab, [&](int, float value) {
    if (value > thread_max) {
      // At the first value thread_total is 0 and the factor expf(-inf) is 0.
      thread_total = thread_total * expf(thread_max - value) + 1.0;
      thread_max = value;
    } else {
      thread_total += expf(value - thread_max);
    }
  });
  const float max_logit = block_reduce_max(thread_max, shared_max);
  const double rescaled =
      thread_max == -INFINITY ? 0.0 : thread_total * expf(thread_max - max_logit);
  const double exp_total = block_reduce_sum(rescaled, shared_sum);
  if (threadIdx.x == 0) {
    p.row_stats[2 * row] = max_logit;
    p.row_stats[2 * row + 1] = static_cast<float>(1.0 / exp_total);
    const int32_t target = p.targets[row];
    // log-sum-exp rather than -log(prob): a target probability that underflows in fp32
    // still gets a finite, accurate loss.
    p.losses[row] = target >= 0 && target < p.vocab
                        ? static_cast<float>(log(exp_total) + double{max_logit} -
                                             double{to_float(x[target])})
                        : NAN;
  }
}

// One block per row (the target and the statistics are read once per row). Each element
// rounds as the CPU does: prob = exp(x - max) * (1/sum) in fp32, times loss_scale, and
// the target's minus loss_scale as a second fp32 rounding; in bf16 or fp16 the fp32
// result is then rounded once.
template <class T>
__global__ void cross_entropy_backward_kernel(CrossEntropyBackwardParams<T> p) {
  const size_t row = blockIdx.x;
  const int32_t target = p.targets[row];
  const float max_logit = p.row_stats[2 * row], inverse_total = p.row_stats[2 * row + 1];
  T* grads = p.dlogits + row * p.row_stride;
  const T* x = p.logits + row * p.row_stride;
  const RowSplit split = split_row(static_cast<const T*>(grads), x, p.vocab);
  update_row(grads, x, split, p.vocab, [&](int v, float logit) {
    const float prob = __fmul_rn(expf(logit - max_logit), inverse_total);
    float grad = __fmul_rn(p.loss_scale, prob);
    if (v == target) grad = __fsub_rn(grad, p.loss_scale);
    return grad;
  });
}

void check_shape(int rows, int vocab, int row_stride) {
  check_positive(rows, "cross-entropy rows");
  check_positive(vocab, "cross-entropy vocab");
  SCALESTUDY_CHECK(row_stride >= vocab, "cross-entropy: row stride shorter than the vocabulary");
}

template <class T>
void cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats, const T* logits,
                           const int32_t* targets, int rows, int vocab, int row_stride) {
  check_shape(rows, vocab, row_stride);
  check_not_null(losses, "cross-entropy losses");
  check_not_null(row_stats, "cross-entropy row statistics");
  check_not_null(logits, "cross-entropy logits");
  check_not_null(targets, "cross-entropy targets");
  const CrossEntropyForwardParams<T> p{losses, row_stats, logits, targets, vocab, row_stride};
  cross_entropy_forward_kernel<T><<<rows, kRowThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

template <class T>
void cross_entropy_backward(cudaStream_t stream, T* dlogits, const T* logits,
                            const float* row_stats, const int32_t* targets, int rows, int vocab,
                            int row_stride, float loss_scale) {
  check_shape(rows, vocab, row_stride);
  check_not_null(dlogits, "cross-entropy dlogits");
  check_not_null(logits, "cross-entropy logits");
  check_not_null(row_stats, "cross-entropy row statistics");
  check_not_null(targets, "cross-entropy targets");
  const CrossEntropyBackwardParams<T> p{dlogits,    logits, row_stats, targets, vocab,
                                        row_stride, loss_scale};
  cross_entropy_backward_kernel<T><<<rows, kRowThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

}  // namespace

void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const float* logits, const int32_t* targets, int rows,
                                          int vocab, int row_stride) {
  cross_entropy_forward(stream, losses, row_stats, logits, targets, rows, vocab, row_stride);
}

void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const bf16* logits, const int32_t* targets, int rows,
                                          int vocab, int row_stride) {
  cross_entropy_forward(stream, losses, row_stats, logits, targets, rows, vocab, row_stride);
}

void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const fp16* logits, const int32_t* targets, int rows,
                                          int vocab, int row_stride) {
  cross_entropy_forward(stream, losses, row_stats, logits, targets, rows, vocab, row_stride);
}

void launch_softmax_cross_entropy_backward(cudaStream_t stream, float* dlogits,
                                           const float* logits, const float* row_stats,
                                           const int32_t* targets, int rows, int vocab,
                                           int row_stride, float loss_scale) {
  cross_entropy_backward(stream, dlogits, logits, row_stats, targets, rows, vocab, row_stride,
                         loss_scale);
}

void launch_softmax_cross_entropy_backward(cudaStream_t stream, bf16* dlogits, const bf16* logits,
                                           const float* row_stats, const int32_t* targets,
                                           int rows, int vocab, int row_stride,
                                           float loss_scale) {
  cross_entropy_backward(stream, dlogits, logits, row_stats, targets, rows, vocab, row_stride,
                         loss_scale);
}

void launch_softmax_cross_entropy_backward(cudaStream_t stream, fp16* dlogits, const fp16* logits,
                                           const float* row_stats, const int32_t* targets,
                                           int rows, int vocab, int row_stride,
                                           float loss_scale) {
  cross_entropy_backward(stream, dlogits, logits, row_stats, targets, rows, vocab, row_stride,
                         loss_scale);
}

}  // namespace scalestudy::cuda
