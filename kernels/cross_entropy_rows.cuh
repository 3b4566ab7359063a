#pragma once
// A row of logits as the cross-entropy kernels read and write it (cross_entropy.cu, and
// the fused forward and backward of cross_entropy_fused.cu): its exponentials, its split
// into 16-byte packs, the packs' conversions, and the gradient of one element. Included
// from those .cu files only.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "cross_entropy.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// log2(e) as an unevaluated sum of two floats: d * log2(e) = fma(d, hi, d * lo) rounds
// once, where d * float(log2(e)) would carry float(log2(e))'s relative error of 1.3e-8
// times |d| into every exponential, the same sign for a whole row.
constexpr float kLog2eHigh = 1.44269502162933349609375f;
constexpr float kLog2eLow = 1.925963033500011079e-8f;

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
    return exp2_flush_to_zero(__fmaf_rn(d, kLog2eHigh, __fmul_rn(d, kLog2eLow)));
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

// The largest value of a pack (fmaxf's NaN rule).
template <class T>
__device__ __forceinline__ float words_max(const Words& m) {
  using Word = WordOf<T>;
  float values[Word::kValues];
  Word::unpack(Word::max(Word::max(m.x, m.y), Word::max(m.z, m.w)), values);
  return Word::kValues == 1 ? values[0] : fmaxf(values[0], values[Word::kValues - 1]);
}

// Wordwise maxima of two packs.
template <class T>
__device__ __forceinline__ Words words_max(const Words& a, const Words& b) {
  using Word = WordOf<T>;
  return Words{Word::max(a.x, b.x), Word::max(a.y, b.y), Word::max(a.z, b.z), Word::max(a.w, b.w)};
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
  // One element, v == target or not.
  __device__ __forceinline__ float of_single(float logit, bool is_target) const {
    const float grad = (*this)(logit);
    return is_target ? at_target(grad) : grad;
  }
  // A pack of logits whose first element is the row's element `offset`.
  __device__ __forceinline__ Words of_pack(const Words& logits, int offset, int target) const {
    constexpr int kCount = Pack<T>::kCount;
    float values[kCount];
    unpack<T>(logits, values);
#pragma unroll
    for (int k = 0; k < kCount; ++k) values[k] = (*this)(values[k]);
    // One pack a row holds the target; the others skip this with one comparison.
    const unsigned target_at = static_cast<unsigned>(target - offset);
    if (target_at < static_cast<unsigned>(kCount)) {
#pragma unroll
      for (int k = 0; k < kCount; ++k)
        if (static_cast<unsigned>(k) == target_at) values[k] = at_target(values[k]);
    }
    return pack_words<T>(values);
  }
};

// What every launcher checks of its rows: positive sizes, and rows at least vocab long.
inline void check_rows(const CrossEntropyRows& call) {
  check_positive(call.rows, "cross-entropy rows");
  check_positive(call.vocab, "cross-entropy vocab");
  SCALESTUDY_CHECK(call.row_stride >= call.vocab,
                   "cross-entropy: row stride shorter than the vocabulary");
}

// What the forward launchers check: the rows, and the operands (none null).
template <class T>
void check_forward_call(const float* losses, const float* row_stats, const T* logits,
                        const CrossEntropyRows& call) {
  check_rows(call);
  check_not_null({{losses, "cross-entropy losses"},
                  {row_stats, "cross-entropy row statistics"},
                  {logits, "cross-entropy logits"},
                  {call.targets, "cross-entropy targets"}});
}

}  // namespace
}  // namespace scalestudy::cuda
