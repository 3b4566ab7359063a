#include "cross_entropy.cuh"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "cross_entropy_rows.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// Rows belong to warps (a few of them when rows are few), not blocks: a warp's running
// max stays warp-uniform, so the statistics need shuffles only, and a row owned by one
// warp ends without a barrier.
constexpr int kBlockThreads = 256;
constexpr int kBlockWarps = kBlockThreads / kWarpSize;
// Four blocks a multiprocessor, so at most 64 registers a thread: 32 warps, each with a
// chunk's loads in flight.
constexpr int kMinBlocks = 4;
// A lane issues all loads of its chunk before it uses any: 8 x 16 bytes, so 4 KiB a warp
// and 128 KiB a multiprocessor in flight, well above what HBM's latency times its
// bandwidth asks (~40 KiB a multiprocessor on an H200).
constexpr int kLanePacks = 8;
constexpr int kChunkPacks = kWarpSize * kLanePacks;
// With few rows a row gets several warps (up to a block's 8), until the grid has this
// many: about 32 a multiprocessor on 132 of them. A constant, so that the launch shape,
// and with it the rounding of the row sums, depends on the row count but never on the
// device.
constexpr int kTargetWarps = 4096;


// T is the storage of logits and dlogits (fp32, bf16 or fp16); losses and row_stats are
// fp32. Not __restrict__: dlogits may be logits. call: the launch's rows.
template <class T>
struct CrossEntropyForwardParams {
  float *losses, *row_stats;
  const T* logits;
  CrossEntropyRows call;
  int warps_per_row;
};

template <class T>
struct CrossEntropyBackwardParams {
  T* dlogits;
  const T* logits;
  const float* row_stats;
  CrossEntropyRows call;
  int warps_per_row;
  float loss_scale;
};

// Which row a warp works on, and which of the row's warps it is: a block holds
// kBlockWarps / warps_per_row rows, each on consecutive warps. The last block's row may
// lie past the end.
struct RowPart {
  long long row;
  int part;
};

__device__ __forceinline__ RowPart row_part(int warps_per_row) {
  const int warp = threadIdx.x / kWarpSize;
  return RowPart{static_cast<long long>(blockIdx.x) * (kBlockWarps / warps_per_row) +
                     warp / warps_per_row,
                 warp % warps_per_row};
}

// A lane's packs of one chunk: packs chunk * 256 + lane + 32 j of the row's packs. All
// loads are issued before any value is used; packs past the end read as -inf, which
// neither raises a max nor adds to a sum of exponentials.
template <class T>
__device__ __forceinline__ void load_chunk(Words (&packs)[kLanePacks], const T* packed,
                                           int chunk, int lane, int count) {
  constexpr uint32_t kEmpty = WordOf<T>::kNegativeInfinity;
  const Words* words = reinterpret_cast<const Words*>(packed);
  const int first = chunk * kChunkPacks + lane;
  // All but a row's last chunk are whole: no comparisons, no -inf moves.
  if ((chunk + 1) * kChunkPacks <= count) {
#pragma unroll
    for (int j = 0; j < kLanePacks; ++j) packs[j] = words[first + j * kWarpSize];
    return;
  }
#pragma unroll
  for (int j = 0; j < kLanePacks; ++j) {
    const int pack = first + j * kWarpSize;
    packs[j] = pack < count ? words[pack] : Words{kEmpty, kEmpty, kEmpty, kEmpty};
  }
}

// The largest of a lane's chunk, ignoring NaN as fmaxf does (the sum of exponentials
// still meets the NaN): one chain per word of a pack, then the words' values.
template <class T>
__device__ __forceinline__ float lane_max(const Words (&packs)[kLanePacks]) {
  Words m = packs[0];
#pragma unroll
  for (int j = 1; j < kLanePacks; ++j) m = words_max<T>(m, packs[j]);
  return words_max<T>(m);
}

// The sum of exp(x - base) over one pack, each term added in double. A row's sum then
// rounds alike however the row is split into packs, as the CPU's double sum does: the
// padded logits' rows (aligned) and the plain ones (at every alignment) get the same
// statistics, bit for bit in practice, where an fp32 tree of each pack's terms moved
// 1/sum by an ulp in a few percent of the rows.
template <class T>
__device__ __forceinline__ double pack_exp_sum(const Words& pack, float base) {
  constexpr int kCount = Pack<T>::kCount;
  float terms[kCount];
  unpack<T>(pack, terms);
  double total = 0.0;
#pragma unroll
  for (int k = 0; k < kCount; ++k) total += row_exp<T>(terms[k] - base);
  return total;
}

// Each row is read once, by its warps, a chunk of 8 packs a lane at a time. Per chunk a
// warp takes the chunk's max first, so its running max (warp-uniform) moves at most once a
// chunk, and the sum so far is rescaled in double (exp of a double difference, ~1e-16).
// Error of the sum: each term exp(x - running max) <= 1 is row_exp's, and the terms are
// added in double (pack_exp_sum), ~1e-16 relative. Rows of one chunk (up to 2048 16-bit or
// 1024 fp32 elements) take their single elements into that chunk, so every term is exp(x -
// row max), as on the CPU. The loss comes from this log-sum-exp, never from a stored
// probability.
template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocks)
    cross_entropy_forward_kernel(CrossEntropyForwardParams<T> p) {
  constexpr int kCount = Pack<T>::kCount;
  __shared__ float shared_max[kBlockWarps];
  __shared__ double shared_total[kBlockWarps];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const RowPart at = row_part(p.warps_per_row);
  float running_max = -INFINITY;
  double total = 0.0;  // this lane's sum of exp(x - running_max)
  if (at.row < p.call.rows) {
    const T* x = p.logits + size_t(at.row) * p.call.row_stride;
    const RowSplit split = split_row(x, x, p.call.vocab);
    const int singles = p.call.vocab - split.packs * kCount;
    const int chunks = max(1, (split.packs + kChunkPacks - 1) / kChunkPacks);
    for (int chunk = at.part; chunk < chunks; chunk += p.warps_per_row) {
      Words packs[kLanePacks];
      load_chunk(packs, x + split.head, chunk, lane, split.packs);
      float chunk_max = lane_max<T>(packs);
      if (chunk == 0)
        for (int j = lane; j < singles; j += kWarpSize)
          chunk_max = fmaxf(chunk_max, to_float(x[single_index<T>(split, j)]));
      chunk_max = fmaxf(running_max, warp_reduce_max(chunk_max));
      // A max of -inf means every value so far is -inf or NaN: against 0 they give 0 or
      // NaN, where -inf - -inf would turn the -infs into NaN.
      const float base = chunk_max == -INFINITY ? 0.0f : chunk_max;
      double chunk_total = 0.0;
#pragma unroll
      for (int j = 0; j < kLanePacks; ++j) chunk_total += pack_exp_sum<T>(packs[j], base);
      if (chunk == 0)
        for (int j = lane; j < singles; j += kWarpSize)
          chunk_total += row_exp<T>(to_float(x[single_index<T>(split, j)]) - base);
      // Rescaled once the chunk's registers are free. From -inf the factor is 0 and the
      // sum so far 0 (or NaN, which stays).
      if (chunk_max > running_max) total *= exp(double{running_max} - double{chunk_max});
      total += chunk_total;
      running_max = chunk_max;
    }
  }
  total = warp_reduce_sum(total);
  if (p.warps_per_row > 1) {
    // The row's warps in a fixed order; a warp that saw nothing but -inf (or nothing)
    // adds its 0 (or NaN) unscaled.
    if (lane == 0) {
      shared_max[warp] = running_max;
      shared_total[warp] = total;
    }
    __syncthreads();
    if (at.part != 0) return;
    running_max = -INFINITY;
    for (int w = 0; w < p.warps_per_row; ++w)
      running_max = fmaxf(running_max, shared_max[warp + w]);
    total = 0.0;
    for (int w = 0; w < p.warps_per_row; ++w) {
      const float part_max = shared_max[warp + w];
      total += part_max == -INFINITY
                   ? shared_total[warp + w]
                   : shared_total[warp + w] * exp(double{part_max} - double{running_max});
    }
  }
  if (lane != 0 || at.row >= p.call.rows) return;
  const size_t row = static_cast<size_t>(at.row);
  const T* x = p.logits + row * p.call.row_stride;
  p.row_stats[2 * row] = running_max;
  p.row_stats[2 * row + 1] = static_cast<float>(1.0 / total);
  const int32_t target = p.call.targets[row];
  // log-sum-exp rather than -log(prob): a target probability that underflows in fp32
  // still gets a finite, accurate loss.
  p.losses[row] = target >= 0 && target < p.call.vocab
                      ? static_cast<float>(log(total) + double{running_max} -
                                           double{to_float(x[target])})
                      : NAN;
}

// The row's warps as in the forward, with the same chunks: each lane loads its 8 packs,
// then computes and stores them, so in place (dlogits == logits) every element is read
// and written by the same thread, the read first.
template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocks)
    cross_entropy_backward_kernel(CrossEntropyBackwardParams<T> p) {
  constexpr int kCount = Pack<T>::kCount;
  const int lane = threadIdx.x % kWarpSize;
  const RowPart at = row_part(p.warps_per_row);
  if (at.row >= p.call.rows) return;
  const size_t row = static_cast<size_t>(at.row);
  const int32_t target = p.call.targets[row];
  const RowGradient<T> gradient{p.row_stats[2 * row], p.row_stats[2 * row + 1], p.loss_scale};
  T* grads = p.dlogits + row * p.call.row_stride;
  const T* x = p.logits + row * p.call.row_stride;
  const RowSplit split = split_row(static_cast<const T*>(grads), x, p.call.vocab);
  const int singles = p.call.vocab - split.packs * kCount;
  const int stride = p.warps_per_row * kWarpSize;
  for (int j = at.part * kWarpSize + lane; j < singles; j += stride) {
    const int v = single_index<T>(split, j);
    grads[v] = from_float<T>(gradient.of_single(to_float(x[v]), v == target));
  }
  const int chunks = (split.packs + kChunkPacks - 1) / kChunkPacks;
  for (int chunk = at.part; chunk < chunks; chunk += p.warps_per_row) {
    const int first = chunk * kChunkPacks + lane;
    Words packs[kLanePacks];
#pragma unroll
    for (int j = 0; j < kLanePacks; ++j) {
      const int pack = first + j * kWarpSize;
      if (pack < split.packs)
        packs[j] = *reinterpret_cast<const Words*>(x + split.head + size_t(pack) * kCount);
    }
#pragma unroll
    for (int j = 0; j < kLanePacks; ++j) {
      const int pack = first + j * kWarpSize;
      if (pack >= split.packs) continue;
      const int offset = split.head + pack * kCount;
      *reinterpret_cast<Words*>(grads + offset) = gradient.of_pack(packs[j], offset, target);
    }
  }
}

// Warps a row gets: 1, 2, 4 or 8, the fewest that give the grid kTargetWarps.
int warps_per_row(int rows) {
  int warps = 1;
  while (warps < kBlockWarps && static_cast<long long>(rows) * warps < kTargetWarps) warps *= 2;
  return warps;
}

int row_blocks(int rows, int warps) {
  const long long rows_per_block = kBlockWarps / warps;
  return static_cast<int>((rows + rows_per_block - 1) / rows_per_block);
}

}  // namespace

template <class T>
void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats,
                                          const T* logits, CrossEntropyRows call) {
  check_forward_call(losses, row_stats, logits, call);
  const int warps = warps_per_row(call.rows);
  const CrossEntropyForwardParams<T> p{losses, row_stats, logits, call, warps};
  cross_entropy_forward_kernel<T><<<row_blocks(call.rows, warps), kBlockThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

template <class T>
void launch_softmax_cross_entropy_backward(cudaStream_t stream, T* dlogits, const T* logits,
                                           const float* row_stats, CrossEntropyRows call,
                                           float loss_scale) {
  check_rows(call);
  check_not_null({{dlogits, "cross-entropy dlogits"},
                  {logits, "cross-entropy logits"},
                  {row_stats, "cross-entropy row statistics"},
                  {call.targets, "cross-entropy targets"}});
  const int warps = warps_per_row(call.rows);
  const CrossEntropyBackwardParams<T> p{dlogits, logits, row_stats, call, warps, loss_scale};
  cross_entropy_backward_kernel<T><<<row_blocks(call.rows, warps), kBlockThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

#define SCALESTUDY_CROSS_ENTROPY_INSTANCES(T)                                                     \
  template void launch_softmax_cross_entropy_forward(cudaStream_t, float*, float*, const T*,      \
                                                     CrossEntropyRows);                           \
  template void launch_softmax_cross_entropy_backward(cudaStream_t, T*, const T*, const float*,   \
                                                      CrossEntropyRows, float);
SCALESTUDY_FOR_EACH_STORAGE(SCALESTUDY_CROSS_ENTROPY_INSTANCES)
#undef SCALESTUDY_CROSS_ENTROPY_INSTANCES

}  // namespace scalestudy::cuda
