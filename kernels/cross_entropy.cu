#include "cross_entropy.cuh"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
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

// log2(e) as an unevaluated sum of two floats: d * log2(e) = fma(d, hi, d * lo) rounds
// once, where d * float(log2(e)) would carry float(log2(e))'s relative error of 1.3e-8
// times |d| into every exponential, the same sign for a whole row.
constexpr float kLog2eHigh = 1.44269502162933349609375f;
constexpr float kLog2eLow = 1.925963033500011079e-8f;

// T is the storage of logits and dlogits (fp32, bf16 or fp16); losses and row_stats are
// fp32. Not __restrict__: dlogits may be logits.
template <class T>
struct CrossEntropyForwardParams {
  float* losses;
  float* row_stats;
  const T* logits;
  const int32_t* targets;
  int rows;
  int vocab;
  int row_stride;
  int warps_per_row;
};

template <class T>
struct CrossEntropyBackwardParams {
  T* dlogits;
  const T* logits;
  const float* row_stats;
  const int32_t* targets;
  int rows;
  int vocab;
  int row_stride;
  int warps_per_row;
  float loss_scale;
};

// exp(d) for the d = logit - max of a row (d <= 0, or -inf, or NaN), per storage type.
// fp32 keeps expf (within 2 ulp), which the bit-exact fp32 backward relies on. 16-bit
// logits take the hardware exp2 (ex2.approx.ftz: exp2f is this instruction plus a
// rescaling for subnormal results, and is documented within 2 ulp) of d * log2(e)
// rounded once, which adds |d| * 2^-24: relative error <= 2.4e-7 + 6e-8 |d|, 3e-7 at
// d = -1 and 2e-6 only at d = -30, where a term is 1e-13 of the max's; for gradients
// hundreds to thousands of times below their 16-bit rounding (2^-9 bf16, 2^-12 fp16).
// Results below 2^-126 flush to zero: a bf16 gradient under 1e-38 becomes 0; fp16 rounds
// such values to 0 anyway. Three instructions an element where expf takes eight, which
// keeps the forward's arithmetic well under its memory time.
template <class T>
__device__ __forceinline__ float row_exp(float d) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(d);
  } else {
    const float exponent = __fmaf_rn(d, kLog2eHigh, __fmul_rn(d, kLog2eLow));
    float result;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(exponent));
    return result;
  }
}

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

// The elements outside the packs, numbered 0 .. count - packs * kCount - 1: the head,
// then the tail.
template <class T>
__device__ __forceinline__ int single_index(RowSplit split, int j) {
  return j < split.head ? j : j + split.packs * Pack<T>::kCount;
}

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

// A pack is held as its four 32-bit words, each one fp32 value or two 16-bit ones, and
// converted a word at a time: held as 16-bit elements (Pack<T>), each bf16 high half
// got a register of its own on load, 32 registers more a chunk. Conversions and
// rounding are those of to_float and from_float.
using Words = uint4;

template <class T>
struct WordOf;

template <>
struct WordOf<float> {
  static constexpr int kValues = 1;
  static constexpr uint32_t kNegativeInfinity = 0xff800000u;
  __device__ static void unpack(uint32_t word, float* values) { values[0] = __uint_as_float(word); }
  __device__ static uint32_t pack(const float* values) { return __float_as_uint(values[0]); }
  __device__ static uint32_t max(uint32_t a, uint32_t b) {
    return __float_as_uint(fmaxf(__uint_as_float(a), __uint_as_float(b)));
  }
};

template <class Pair>
struct HalfWord {
  static constexpr int kValues = 2;
  __device__ static Pair pair(uint32_t word) { return *reinterpret_cast<const Pair*>(&word); }
  __device__ static uint32_t bits(Pair pair) { return *reinterpret_cast<const uint32_t*>(&pair); }
  // 16-bit values compared two at a time in their storage type, which is exact.
  __device__ static uint32_t max(uint32_t a, uint32_t b) { return bits(__hmax2(pair(a), pair(b))); }
};

template <>
struct WordOf<bf16> : HalfWord<__nv_bfloat162> {
  static constexpr uint32_t kNegativeInfinity = 0xff80ff80u;
  // bf16 is the upper half of an fp32: widening is a shift or a mask.
  __device__ static void unpack(uint32_t word, float* values) {
    values[0] = __uint_as_float(word << 16);
    values[1] = __uint_as_float(word & 0xffff0000u);
  }
  __device__ static uint32_t pack(const float* values) {
    return bits(__floats2bfloat162_rn(values[0], values[1]));
  }
};

template <>
struct WordOf<fp16> : HalfWord<__half2> {
  static constexpr uint32_t kNegativeInfinity = 0xfc00fc00u;
  __device__ static void unpack(uint32_t word, float* values) {
    const float2 widened = __half22float2(pair(word));
    values[0] = widened.x;
    values[1] = widened.y;
  }
  __device__ static uint32_t pack(const float* values) {
    return bits(__floats2half2_rn(values[0], values[1]));
  }
};

__device__ __forceinline__ uint32_t word_at(const Words& words, int i) {
  return i == 0 ? words.x : i == 1 ? words.y : i == 2 ? words.z : words.w;
}

// The pack's kCount values, in memory order.
template <class T>
__device__ __forceinline__ void unpack(const Words& words, float (&values)[Pack<T>::kCount]) {
  using Word = WordOf<T>;
#pragma unroll
  for (int i = 0; i < 4; ++i) Word::unpack(word_at(words, i), values + i * Word::kValues);
}

template <class T>
__device__ __forceinline__ Words pack_words(const float (&values)[Pack<T>::kCount]) {
  using Word = WordOf<T>;
  return Words{Word::pack(values), Word::pack(values + Word::kValues),
               Word::pack(values + 2 * Word::kValues), Word::pack(values + 3 * Word::kValues)};
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
  using Word = WordOf<T>;
  Words m = packs[0];
#pragma unroll
  for (int j = 1; j < kLanePacks; ++j) {
    m.x = Word::max(m.x, packs[j].x);
    m.y = Word::max(m.y, packs[j].y);
    m.z = Word::max(m.z, packs[j].z);
    m.w = Word::max(m.w, packs[j].w);
  }
  float values[Word::kValues];
  Word::unpack(Word::max(Word::max(m.x, m.y), Word::max(m.z, m.w)), values);
  return Word::kValues == 1 ? values[0] : fmaxf(values[0], values[Word::kValues - 1]);
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
  if (at.row < p.rows) {
    const T* x = p.logits + size_t(at.row) * p.row_stride;
    const RowSplit split = split_row(x, x, p.vocab);
    const int singles = p.vocab - split.packs * kCount;
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
  if (lane != 0 || at.row >= p.rows) return;
  const size_t row = static_cast<size_t>(at.row);
  const T* x = p.logits + row * p.row_stride;
  p.row_stats[2 * row] = running_max;
  p.row_stats[2 * row + 1] = static_cast<float>(1.0 / total);
  const int32_t target = p.targets[row];
  // log-sum-exp rather than -log(prob): a target probability that underflows in fp32
  // still gets a finite, accurate loss.
  p.losses[row] = target >= 0 && target < p.vocab
                      ? static_cast<float>(log(total) + double{running_max} -
                                           double{to_float(x[target])})
                      : NAN;
}

// Each element rounds as the CPU does: prob = exp(x - max) * (1/sum) in fp32, times
// loss_scale, and the target's minus loss_scale as a second fp32 rounding; in bf16 or
// fp16 the fp32 result is then rounded once. The same function on the pack and single
// paths, so the bits do not depend on a row's alignment.
template <class T>
struct RowGradient {
  float max_logit;
  float inverse_total;
  float loss_scale;
  __device__ __forceinline__ float operator()(float logit) const {
    const float prob = __fmul_rn(row_exp<T>(logit - max_logit), inverse_total);
    return __fmul_rn(loss_scale, prob);
  }
  __device__ __forceinline__ float at_target(float grad) const {
    return __fsub_rn(grad, loss_scale);
  }
};

// The row's warps as in the forward, with the same chunks: each lane loads its 8 packs,
// then computes and stores them, so in place (dlogits == logits) every element is read
// and written by the same thread, the read first.
template <class T>
__global__ void __launch_bounds__(kBlockThreads, kMinBlocks)
    cross_entropy_backward_kernel(CrossEntropyBackwardParams<T> p) {
  constexpr int kCount = Pack<T>::kCount;
  const int lane = threadIdx.x % kWarpSize;
  const RowPart at = row_part(p.warps_per_row);
  if (at.row >= p.rows) return;
  const size_t row = static_cast<size_t>(at.row);
  const int32_t target = p.targets[row];
  const RowGradient<T> gradient{p.row_stats[2 * row], p.row_stats[2 * row + 1], p.loss_scale};
  T* grads = p.dlogits + row * p.row_stride;
  const T* x = p.logits + row * p.row_stride;
  const RowSplit split = split_row(static_cast<const T*>(grads), x, p.vocab);
  const int singles = p.vocab - split.packs * kCount;
  const int stride = p.warps_per_row * kWarpSize;
  for (int j = at.part * kWarpSize + lane; j < singles; j += stride) {
    const int v = single_index<T>(split, j);
    float grad = gradient(to_float(x[v]));
    if (v == target) grad = gradient.at_target(grad);
    grads[v] = from_float<T>(grad);
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
      float values[kCount];
      unpack<T>(packs[j], values);
#pragma unroll
      for (int k = 0; k < kCount; ++k) values[k] = gradient(values[k]);
      // One pack a row holds the target; the others skip this with one comparison.
      const unsigned target_at = static_cast<unsigned>(target - offset);
      if (target_at < static_cast<unsigned>(kCount)) {
#pragma unroll
        for (int k = 0; k < kCount; ++k)
          if (static_cast<unsigned>(k) == target_at) values[k] = gradient.at_target(values[k]);
      }
      *reinterpret_cast<Words*>(grads + offset) = pack_words<T>(values);
    }
  }
}

void check_shape(int rows, int vocab, int row_stride) {
  check_positive(rows, "cross-entropy rows");
  check_positive(vocab, "cross-entropy vocab");
  SCALESTUDY_CHECK(row_stride >= vocab, "cross-entropy: row stride shorter than the vocabulary");
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

template <class T>
void cross_entropy_forward(cudaStream_t stream, float* losses, float* row_stats, const T* logits,
                           const int32_t* targets, int rows, int vocab, int row_stride) {
  check_shape(rows, vocab, row_stride);
  check_not_null(losses, "cross-entropy losses");
  check_not_null(row_stats, "cross-entropy row statistics");
  check_not_null(logits, "cross-entropy logits");
  check_not_null(targets, "cross-entropy targets");
  const int warps = warps_per_row(rows);
  const CrossEntropyForwardParams<T> p{losses, row_stats, logits,     targets,
                                       rows,   vocab,     row_stride, warps};
  cross_entropy_forward_kernel<T><<<row_blocks(rows, warps), kBlockThreads, 0, stream>>>(p);
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
  const int warps = warps_per_row(rows);
  const CrossEntropyBackwardParams<T> p{dlogits, logits,     row_stats, targets,   rows,
                                        vocab,   row_stride, warps,     loss_scale};
  cross_entropy_backward_kernel<T><<<row_blocks(rows, warps), kBlockThreads, 0, stream>>>(p);
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
