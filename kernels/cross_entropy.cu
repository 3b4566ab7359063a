#include "cross_entropy.cuh"

#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// A GPT-2 row is 50257 logits: 512 threads give each about a hundred, in two passes
// (max and sum, then write) whose re-read of the row mostly hits L2.
constexpr int kRowThreads = 512;

// T is the storage of logits, probs and dlogits (fp32, bf16 or fp16); losses are fp32.
template <class T>
struct CrossEntropyForwardParams {
  float* losses;
  T* probs;
  const T* logits;
  const int32_t* targets;
  int vocab;
};

template <class T>
struct CrossEntropyBackwardParams {
  T* dlogits;
  const T* probs;
  const int32_t* targets;
  int vocab;
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

// out[v] = from_float(f(v, in[v], out[v])) for every element of two rows with one split;
// without kReadsOut, out is only written and f gets 0 for its old value.
template <bool kReadsOut, class T, class F>
__device__ void update_row(T* out, const T* in, RowSplit split, int count, F f) {
  constexpr int kCount = Pack<T>::kCount;
  auto old_value = [&](int v) { return kReadsOut ? to_float(out[v]) : 0.0f; };
  for (int v = threadIdx.x; v < split.head; v += blockDim.x)
    out[v] = from_float<T>(f(v, to_float(in[v]), old_value(v)));
  for (int p = threadIdx.x; p < split.packs; p += blockDim.x) {
    const int first = split.head + p * kCount;
    const Pack<T> source = load_pack(in + first);
    Pack<T> target;
    if (kReadsOut) target = load_pack(out + first);
#pragma unroll
    for (int k = 0; k < kCount; ++k)
      target.set(k, f(first + k, source.get(k), kReadsOut ? target.get(k) : 0.0f));
    store_pack(out + first, target);
  }
  for (int v = split.head + split.packs * kCount + threadIdx.x; v < count; v += blockDim.x)
    out[v] = from_float<T>(f(v, to_float(in[v]), old_value(v)));
}

// One block per row, two passes over the logits. The first finds the max and the sum of
// exponentials together: each thread keeps the sum of exp(x - m) for its own running max
// m, rescaled when m grows, and the block combines them after reducing the max; every
// exponent is <= 0, and the sums are in double, as on the CPU. The loss comes from this
// log-sum-exp of the stored logits, never from the (possibly 16-bit) stored probabilities
// (in fp16 those below 2^-24 are 0).
template <class T>
__global__ void cross_entropy_forward_kernel(CrossEntropyForwardParams<T> p) {
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  const int row = blockIdx.x;
  const T* x = p.logits + size_t(row) * p.vocab;
  T* prob_row = p.probs + size_t(row) * p.vocab;
  const RowSplit split = split_row(x, static_cast<const T*>(prob_row), p.vocab);
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
  const float inverse_total = static_cast<float>(1.0 / exp_total);
  update_row<false>(prob_row, x, split, p.vocab, [&](int, float logit, float) {
    return __fmul_rn(expf(logit - max_logit), inverse_total);
  });
  if (threadIdx.x == 0) {
    const int32_t target = p.targets[row];
    // log-sum-exp rather than -log(prob): a target probability that underflows in fp32
    // still gets a finite, accurate loss.
    p.losses[row] = target >= 0 && target < p.vocab
                        ? static_cast<float>(log(exp_total) + double{max_logit} -
                                             double{to_float(x[target])})
                        : NAN;
  }
}

// One block per row (the target is read once per row, and no element needs a 64-bit
// division to find its row). The target element is updated in two fp32 roundings,
// += scale*prob then -= scale, exactly as the CPU does; in bf16 or fp16 the fp32 result is
// then rounded once.
template <class T>
__global__ void cross_entropy_backward_kernel(CrossEntropyBackwardParams<T> p) {
  const size_t row = blockIdx.x;
  const int32_t target = p.targets[row];
  T* grads = p.dlogits + row * p.vocab;
  const T* prob_row = p.probs + row * p.vocab;
  const RowSplit split = split_row(static_cast<const T*>(grads), prob_row, p.vocab);
  update_row<true>(grads, prob_row, split, p.vocab, [&](int v, float prob, float prior) {
    float grad = __fadd_rn(prior, __fmul_rn(p.loss_scale, prob));
    if (v == target) grad = __fsub_rn(grad, p.loss_scale);
    return grad;
  });
}

void check_shape(int rows, int vocab) {
  check_positive(rows, "cross-entropy rows");
  check_positive(vocab, "cross-entropy vocab");
}

template <class T>
void cross_entropy_forward(cudaStream_t stream, float* losses, T* probs, const T* logits,
                           const int32_t* targets, int rows, int vocab) {
  check_shape(rows, vocab);
  check_not_null(losses, "cross-entropy losses");
  check_not_null(probs, "cross-entropy probs");
  check_not_null(logits, "cross-entropy logits");
  check_not_null(targets, "cross-entropy targets");
  const CrossEntropyForwardParams<T> p{losses, probs, logits, targets, vocab};
  cross_entropy_forward_kernel<T><<<rows, kRowThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

template <class T>
void cross_entropy_backward(cudaStream_t stream, T* dlogits, const T* probs,
                            const int32_t* targets, int rows, int vocab, float loss_scale) {
  check_shape(rows, vocab);
  check_not_null(dlogits, "cross-entropy dlogits");
  check_not_null(probs, "cross-entropy probs");
  check_not_null(targets, "cross-entropy targets");
  const CrossEntropyBackwardParams<T> p{dlogits, probs, targets, vocab, loss_scale};
  cross_entropy_backward_kernel<T><<<rows, kRowThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

}  // namespace

void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* probs,
                                          const float* logits, const int32_t* targets, int rows,
                                          int vocab) {
  cross_entropy_forward(stream, losses, probs, logits, targets, rows, vocab);
}

void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, bf16* probs,
                                          const bf16* logits, const int32_t* targets, int rows,
                                          int vocab) {
  cross_entropy_forward(stream, losses, probs, logits, targets, rows, vocab);
}

void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, fp16* probs,
                                          const fp16* logits, const int32_t* targets, int rows,
                                          int vocab) {
  cross_entropy_forward(stream, losses, probs, logits, targets, rows, vocab);
}

void launch_softmax_cross_entropy_backward(cudaStream_t stream, float* dlogits,
                                           const float* probs, const int32_t* targets, int rows,
                                           int vocab, float loss_scale) {
  cross_entropy_backward(stream, dlogits, probs, targets, rows, vocab, loss_scale);
}

void launch_softmax_cross_entropy_backward(cudaStream_t stream, bf16* dlogits, const bf16* probs,
                                           const int32_t* targets, int rows, int vocab,
                                           float loss_scale) {
  cross_entropy_backward(stream, dlogits, probs, targets, rows, vocab, loss_scale);
}

void launch_softmax_cross_entropy_backward(cudaStream_t stream, fp16* dlogits, const fp16* probs,
                                           const int32_t* targets, int rows, int vocab,
                                           float loss_scale) {
  cross_entropy_backward(stream, dlogits, probs, targets, rows, vocab, loss_scale);
}

}  // namespace scalestudy::cuda
