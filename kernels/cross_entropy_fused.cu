#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "cross_entropy.cuh"
#include "cross_entropy_rows.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// A block a row, which it copies into shared memory once: the row's max, its sum of
// exponentials and its gradient are then three passes over shared memory, and the
// logits cross the memory bus twice (one read, one write) where the forward and backward
// kernels take three (a read each, and the backward's write).
constexpr int kFusedThreads = 512;
// Two blocks a multiprocessor: while one block reduces its row, the other's copies are in
// flight. A GPT-2 row (50257 16-bit logits) takes 100.5 KB, so two fit in an H200's 228 KB.
constexpr int kFusedMinBlocks = 2;
// Rows longer than this (vocabularies past 102400 in 16 bits) take the two kernels. A
// constant rather than the device's limit, so that which kernels run, and so the
// rounding of the row sums, depends on the shape alone.
constexpr size_t kMaxFusedRowBytes = 200 * 1024;

// call: the launch's rows, one a block.
template <class T>
struct CrossEntropyFusedParams {
  float *losses, *row_stats;
  T* logits;  // overwritten with dlogits
  CrossEntropyRows call;
  float loss_scale;
};

// The sum of exp(x - base) over one pack: the terms added pairwise in fp32 (three
// roundings on each term's way, relative error <= 3 * 2^-24 of the pack's sum), the packs'
// sums then in double. Converting each term to double, as the forward kernel does, would
// put a conversion per element into a pass that nothing overlaps within the block.
template <class T>
__device__ __forceinline__ float pack_exp_sum_pairwise(const Words& pack, float base) {
  constexpr int kCount = Pack<T>::kCount;
  float terms[kCount];
  unpack<T>(pack, terms);
#pragma unroll
  for (int k = 0; k < kCount; ++k) terms[k] = row_exp<T>(terms[k] - base);
#pragma unroll
  for (int width = kCount / 2; width > 0; width /= 2)
#pragma unroll
    for (int k = 0; k < width; ++k) terms[k] += terms[k + width];
  return terms[0];
}

// The statistics and the loss as the forward kernel defines them, and the gradient as
// the backward kernel computes it from those statistics (RowGradient): given the same
// row max and 1/sum, dlogits are bit for bit the backward kernel's. The sums are added
// in a fixed order (each thread's packs in turn, then block_reduce_sum), so a row's
// statistics depend on its values and on where its packs start: unlike the forward
// kernel's double per term, the pairwise pack sums group the terms by alignment. The
// classifier's padded logits align every row alike.
template <class T>
__global__ void __launch_bounds__(kFusedThreads, kFusedMinBlocks)
    cross_entropy_fused_kernel(CrossEntropyFusedParams<T> p) {
  constexpr int kCount = Pack<T>::kCount;
  extern __shared__ Words row_packs[];
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_total[kWarpSize];
  const size_t row = blockIdx.x;
  T* x = p.logits + row * p.call.row_stride;
  const RowSplit split =
      split_row(static_cast<const T*>(x), static_cast<const T*>(x), p.call.vocab);
  const int singles = p.call.vocab - split.packs * kCount;
  T* row_singles = reinterpret_cast<T*>(row_packs + split.packs);

  const Words* packed = reinterpret_cast<const Words*>(x + split.head);
  for (int i = threadIdx.x; i < split.packs; i += kFusedThreads)
    copy_async_16(row_packs + i, packed + i);
  copy_async_commit();
  for (int j = threadIdx.x; j < singles; j += kFusedThreads)
    row_singles[j] = x[single_index<T>(split, j)];
  const int32_t target = p.call.targets[row];
  const bool target_in_range = target >= 0 && target < p.call.vocab;
  // Read before the barrier, after which other threads overwrite the row.
  const float target_logit = threadIdx.x == 0 && target_in_range ? to_float(x[target]) : 0.0f;
  copy_async_wait<0>();
  __syncthreads();

  constexpr uint32_t kEmpty = WordOf<T>::kNegativeInfinity;
  Words packs_max{kEmpty, kEmpty, kEmpty, kEmpty};
  for (int i = threadIdx.x; i < split.packs; i += kFusedThreads)
    packs_max = words_max<T>(packs_max, row_packs[i]);
  float thread_max = words_max<T>(packs_max);
  for (int j = threadIdx.x; j < singles; j += kFusedThreads)
    thread_max = fmaxf(thread_max, to_float(row_singles[j]));
  const float row_max = block_reduce_max(thread_max, shared_max);
  // A max of -inf means every value is -inf or NaN: against 0 they give 0 or NaN, where
  // -inf - -inf would turn the -infs into NaN.
  const float base = row_max == -INFINITY ? 0.0f : row_max;

  double total = 0.0;
  for (int i = threadIdx.x; i < split.packs; i += kFusedThreads)
    total += pack_exp_sum_pairwise<T>(row_packs[i], base);
  for (int j = threadIdx.x; j < singles; j += kFusedThreads)
    total += row_exp<T>(to_float(row_singles[j]) - base);
  total = block_reduce_sum(total, shared_total);
  const float inverse_total = static_cast<float>(1.0 / total);
  if (threadIdx.x == 0) {
    p.row_stats[2 * row] = row_max;
    p.row_stats[2 * row + 1] = inverse_total;
    p.losses[row] = target_in_range ? static_cast<float>(log(total) + double{row_max} -
                                                         double{target_logit})
                                    : NAN;
  }

  const RowGradient<T> gradient{row_max, inverse_total, p.loss_scale};
  Words* grads = reinterpret_cast<Words*>(x + split.head);
  for (int i = threadIdx.x; i < split.packs; i += kFusedThreads)
    grads[i] = gradient.of_pack(row_packs[i], split.head + i * kCount, target);
  for (int j = threadIdx.x; j < singles; j += kFusedThreads) {
    const int v = single_index<T>(split, j);
    x[v] = from_float<T>(gradient.of_single(to_float(row_singles[j]), v == target));
  }
}

}  // namespace

template <class T>
void launch_softmax_cross_entropy_forward_backward(cudaStream_t stream, float* losses,
                                                   float* row_stats, T* logits,
                                                   CrossEntropyRows call, float loss_scale) {
  check_forward_call(losses, row_stats, logits, call);
  // The packs and the single elements of a row fill vocab * sizeof(T) bytes of shared
  // memory however the row is aligned.
  const size_t row_bytes = (size_t(call.vocab) * sizeof(T) + 15) / 16 * 16;
  if (row_bytes > kMaxFusedRowBytes) {
    launch_softmax_cross_entropy_forward(stream, losses, row_stats, static_cast<const T*>(logits),
                                         call);
    launch_softmax_cross_entropy_backward(stream, logits, static_cast<const T*>(logits), row_stats,
                                          call, loss_scale);
    return;
  }
  CHECK_CUDA(cudaFuncSetAttribute(cross_entropy_fused_kernel<T>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(row_bytes)));
  // Two rows a multiprocessor need all of its shared memory as such, not as L1.
  CHECK_CUDA(cudaFuncSetAttribute(cross_entropy_fused_kernel<T>,
                                  cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
  const CrossEntropyFusedParams<T> p{losses, row_stats, logits, call, loss_scale};
  cross_entropy_fused_kernel<T><<<call.rows, kFusedThreads, row_bytes, stream>>>(p);
  CHECK_LAUNCH();
}

#define SCALESTUDY_FUSED_CROSS_ENTROPY_INSTANCES(T)                                               \
  template void launch_softmax_cross_entropy_forward_backward(cudaStream_t, float*, float*, T*,   \
                                                              CrossEntropyRows, float);
SCALESTUDY_FOR_EACH_16BIT_STORAGE(SCALESTUDY_FUSED_CROSS_ENTROPY_INSTANCES)
#undef SCALESTUDY_FUSED_CROSS_ENTROPY_INSTANCES

}  // namespace scalestudy::cuda
