#include "layernorm.cuh"

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "common.cuh"
#include "precision.cuh"
#include "reductions.cuh"

namespace scalestudy::cuda {
namespace {

constexpr int kRowThreads = 128;

// The warp-per-row kernels hold a row in registers as 16-byte packs, lane l taking packs
// l, l + 32, ...: at most kMaxPacksPerLane of them, which is 2048 channels in bf16 or
// fp16 and 1024 in fp32. Wider rows (and rows that are not whole aligned packs) take the
// block-per-row kernels.
constexpr int kMaxPacksPerLane = 8;
constexpr int kForwardWarps = 4;
constexpr int kBackwardWarps = 8;
// Rows of one backward block, whose parameter-gradient contributions become one partial
// row. kBackwardChunkRows at the least: enough rows to keep the partials small next to the
// activations, few enough that 8192 rows still give a wave of 256 blocks. Above 16384 rows
// a block takes twice, then four times as many, so that at most 512 blocks pay for closing
// partial rows until the rows reach kMaxBackwardChunkRows a block. A function of the rows
// alone, so that the bits of the sums depend on the shape only.
constexpr int kBackwardChunkRows = 32;
constexpr int kMaxBackwardChunkRows = 128;
constexpr int kMaxBackwardBlocksBeforeGrowing = 512;
int backward_chunk_rows(int rows) {
  int chunk_rows = kBackwardChunkRows;
  while (chunk_rows < kMaxBackwardChunkRows && rows > kMaxBackwardBlocksBeforeGrowing * chunk_rows)
    chunk_rows *= 2;
  return chunk_rows;
}
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// The kernels take the launchers' LayerNormForwardArgs and LayerNormBackwardArgs. T is the
// storage of the activations (inp, out, dout, dinp) and of the parameters read (weight,
// bias: in bf16 or fp16, the backend's 16-bit copy of the parameters): fp32, bf16 or fp16.
// mean, rstd and the parameter gradients are fp32 whatever T is.

// x normalised by its row's statistics, rounded as the CPU's (x - mean) * rstd.
__device__ __forceinline__ float normalized(float x, float mean, float rstd) {
  return __fmul_rn(x - mean, rstd);
}

// The __f*_rn intrinsics below are never fused into multiply-adds, so each per-element
// expression rounds exactly as the CPU reference's does, and the GPU-vs-CPU comparison
// only sees the difference in reduction order (and, in bf16 or fp16, the final rounding).

// The elements from one output row to the next (row_stride, op_params.h, on the device).
template <class T>
__device__ __forceinline__ size_t out_row_elems(const LayerNormForwardArgs<T>& p) {
  return size_t(p.out_stride != 0 ? p.out_stride : p.channels);
}

// One block per row. Mean and variance accumulate in double (two passes; the second
// reads the row from L1), as the CPU does: with C in the thousands an fp32 sum would
// lose the digits that x - mean needs.
template <class T>
__global__ void layernorm_forward_kernel(LayerNormForwardArgs<T> p) {
  __shared__ double shared[kWarpSize];
  const int row = blockIdx.x;
  const T* x = p.inp + size_t(row) * p.channels;
  T* y = p.out + size_t(row) * out_row_elems(p);
  double total = 0.0;
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) total += to_float(x[c]);
  const double row_mean = block_reduce_sum(total, shared) / p.channels;
  double squared = 0.0;
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const double centered = to_float(x[c]) - row_mean;
    squared += centered * centered;
  }
  const double variance = block_reduce_sum(squared, shared) / p.channels;
  const double row_rstd = 1.0 / sqrt(variance + kLayerNormEpsilon);
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const float normed = static_cast<float>((to_float(x[c]) - row_mean) * row_rstd);
    y[c] = from_float<T>(__fadd_rn(__fmul_rn(normed, to_float(p.weight[c])), to_float(p.bias[c])));
  }
  if (p.out_stride != 0) write_augmented_columns(y + p.channels, threadIdx.x);
  if (threadIdx.x == 0) {
    p.mean[row] = static_cast<float>(row_mean);
    p.rstd[row] = static_cast<float>(row_rstd);
  }
}

// kCount consecutive parameters of storage T from a 16-byte aligned address, widened to
// fp32: one 16-byte pack for 16-bit T (kCount = 8), kCount / 4 of them for fp32. They are
// read-only for the whole launch, so they may come through the non-coherent cache.
template <int kCount, class T>
__device__ __forceinline__ void load_parameters(float (&dst)[kCount], const T* src) {
  constexpr int kPerPack = Pack<T>::kCount;
  static_assert(kCount % kPerPack == 0, "parameters are read a 16-byte pack at a time");
#pragma unroll
  for (int i = 0; i < kCount; i += kPerPack) {
    Pack<T> pack;
    *reinterpret_cast<int4*>(&pack) = __ldg(reinterpret_cast<const int4*>(src + i));
#pragma unroll
    for (int j = 0; j < kPerPack; ++j) dst[i + j] = pack.get(j);
  }
}

// Calls f(k, column) for each pack k < kPacks of a warp-per-row kernel's lane that lies in
// a row of `channels` (lane l holds packs l, l + 32, ... of the row), column being the
// pack's first.
template <int kPacks, int kCount, class F>
__device__ __forceinline__ void for_each_lane_pack(int lane, int channels, F f) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int column = (k * kWarpSize + lane) * kCount;
    if (column < channels) f(k, column);
  }
}

// One warp per row, the row in registers: the whole row's loads are in flight together
// and the statistics need shuffles only, no block barrier. The row stays in its 16-byte
// packs and each pass widens an element to double again (exactly: bf16, fp16 and fp32 all
// widen without rounding): four conversions an element, where a row kept in double took
// two but held 48 registers a lane at C = 768 in 16 bits, 76 in all, so that 24 warps of a
// multiprocessor's 64 ran; in packs the kernel takes 56 and 36 warps run. The operations
// are the block kernel's, element for element.
template <class T, int kPacks>
__global__ void __launch_bounds__(kForwardWarps * kWarpSize)
    layernorm_forward_warp_kernel(LayerNormForwardArgs<T> p) {
  constexpr int kCount = Pack<T>::kCount;
  const int lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * kForwardWarps + threadIdx.x / kWarpSize;
  if (row >= p.rows) return;
  const size_t offset = size_t(row) * p.channels;
  T* out_row = p.out + size_t(row) * out_row_elems(p);
  const auto for_each_pack = [&](auto f) {
    for_each_lane_pack<kPacks, kCount>(lane, p.channels, f);
  };
  Pack<T> packs[kPacks];
  for_each_pack([&](int k, int column) { packs[k] = load_pack(p.inp + offset + column); });
  double total = 0.0;
  for_each_pack([&](int k, int) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) total += packs[k].get(i);
  });
  const double row_mean = warp_reduce_sum(total) / p.channels;
  double squared = 0.0;
  for_each_pack([&](int k, int) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      const double centered = packs[k].get(i) - row_mean;
      squared += centered * centered;
    }
  });
  const double variance = warp_reduce_sum(squared) / p.channels;
  const double row_rstd = 1.0 / sqrt(variance + kLayerNormEpsilon);
  for_each_pack([&](int k, int column) {
    float weight[kCount], bias[kCount];
    load_parameters(weight, p.weight + column);
    load_parameters(bias, p.bias + column);
    Pack<T> result;
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      const float normed = static_cast<float>((packs[k].get(i) - row_mean) * row_rstd);
      result.set(i, __fadd_rn(__fmul_rn(normed, weight[i]), bias[i]));
    }
    store_pack(out_row + column, result);
  });
  if (p.out_stride != 0) write_augmented_columns(out_row + p.channels, lane);
  if (lane == 0) {
    p.mean[row] = static_cast<float>(row_mean);
    p.rstd[row] = static_cast<float>(row_rstd);
  }
}

// One block per row: the input gradient, after the two projections that normalisation
// removes (the mean of dnorm, and its component along the normalised input).
template <class T>
__global__ void layernorm_backward_input_kernel(LayerNormBackwardArgs<T> p,
                                                bool accumulate_dinp) {
  __shared__ double shared[kWarpSize];
  const int row = blockIdx.x;
  const size_t offset = size_t(row) * p.channels;
  const T* x = p.inp + offset;
  const T* dy = p.dout + offset;
  T* dx = p.dinp + offset;
  const float row_mean = p.mean[row];
  const float row_rstd = p.rstd[row];
  double dnorm_total = 0.0, dnorm_dot_norm = 0.0;
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const float normed = normalized(to_float(x[c]), row_mean, row_rstd);
    const float dnorm = __fmul_rn(to_float(p.weight[c]), to_float(dy[c]));
    dnorm_total += dnorm;
    dnorm_dot_norm += static_cast<double>(dnorm) * normed;
  }
  const float dnorm_mean = static_cast<float>(block_reduce_sum(dnorm_total, shared) / p.channels);
  const float dnorm_norm_mean =
      static_cast<float>(block_reduce_sum(dnorm_dot_norm, shared) / p.channels);
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const float normed = normalized(to_float(x[c]), row_mean, row_rstd);
    const float dnorm = __fmul_rn(to_float(p.weight[c]), to_float(dy[c]));
    const float centered = __fsub_rn(dnorm - dnorm_mean, __fmul_rn(normed, dnorm_norm_mean));
    const float gradient = __fmul_rn(row_rstd, centered);
    // Overwriting never reads dx, which may then hold anything, NaN included.
    dx[c] = from_float<T>(accumulate_dinp ? __fadd_rn(to_float(dx[c]), gradient) : gradient);
  }
}

// Per-chunk column partials of dweight (normed * dy) and dbias (dy), in the layout that
// launch_add_column_partials reduces. Block (kColumnTile, kColumnRowLanes).
template <class T>
__global__ void layernorm_backward_param_partials_kernel(float* __restrict__ weight_partials,
                                                         float* __restrict__ bias_partials,
                                                         LayerNormBackwardArgs<T> p) {
  __shared__ float weight_tile[kColumnRowLanes][kColumnTile + 1];
  __shared__ float bias_tile[kColumnRowLanes][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int chunk = blockIdx.y;
  const int row_end = min(p.rows, (chunk + 1) * kColumnChunkRows);
  float weight_total = 0.0f, bias_total = 0.0f;
  if (c < p.channels) {
    for (int r = chunk * kColumnChunkRows + threadIdx.y; r < row_end; r += kColumnRowLanes) {
      const size_t at = size_t(r) * p.channels + c;
      const float normed = normalized(to_float(p.inp[at]), p.mean[r], p.rstd[r]);
      const float dy = to_float(p.dout[at]);
      bias_total += dy;
      weight_total = __fadd_rn(weight_total, __fmul_rn(normed, dy));
    }
  }
  weight_tile[threadIdx.y][threadIdx.x] = weight_total;
  bias_tile[threadIdx.y][threadIdx.x] = bias_total;
  __syncthreads();
  if (threadIdx.y == 0 && c < p.channels) {
    float weight_sum = weight_tile[0][threadIdx.x], bias_sum = bias_tile[0][threadIdx.x];
    for (int lane = 1; lane < kColumnRowLanes; ++lane) {
      weight_sum += weight_tile[lane][threadIdx.x];
      bias_sum += bias_tile[lane][threadIdx.x];
    }
    weight_partials[size_t(chunk) * p.channels + c] = weight_sum;
    bias_partials[size_t(chunk) * p.channels + c] = bias_sum;
  }
}

// An empty asm statement that claims to change the pack: the compiler then recomputes
// what it derived from the pack (a few fp32 operations an element) instead of keeping it
// in registers across the row reduction.
template <class T>
__device__ __forceinline__ void hide_from_compiler(Pack<T>& pack) {
  int4& words = reinterpret_cast<int4&>(pack);
  asm volatile("" : "+r"(words.x), "+r"(words.y), "+r"(words.z), "+r"(words.w));
}

// The block's partial row of one parameter gradient: each warp's column sums go to its
// own row of `warp_sums` ([kBackwardWarps, channels]), which are then added in warp order,
// one column a thread so that the partial row is written coalesced. The closing barrier
// lets the caller reuse `warp_sums` at once.
template <int kPacks, int kCount>
__device__ void write_block_partial_row(float* partial_row, const float (&sums)[kPacks][kCount],
                                        float* warp_sums, int channels) {
  float* own_sums = warp_sums + size_t(threadIdx.x / kWarpSize) * channels;
  for_each_lane_pack<kPacks, kCount>(threadIdx.x % kWarpSize, channels, [&](int k, int column) {
#pragma unroll
    for (int i = 0; i < kCount; i += 4) {
      *reinterpret_cast<float4*>(own_sums + column + i) =
          make_float4(sums[k][i], sums[k][i + 1], sums[k][i + 2], sums[k][i + 3]);
    }
  });
  __syncthreads();
  for (int c = threadIdx.x; c < channels; c += blockDim.x) {
    float total = warp_sums[c];
    for (int warp = 1; warp < kBackwardWarps; ++warp) {
      total += warp_sums[size_t(warp) * channels + c];
    }
    partial_row[c] = total;
  }
  __syncthreads();
}

// The input gradient and the parameter-gradient partials in one pass over x and dy. A
// block takes chunk_rows consecutive rows, warp w the rows w, w + 8, ... of them,
// one at a time and whole in registers, with the arithmetic of the block-per-row kernels
// above but for the row sums' terms: in the 16-bit instantiations a lane adds its own
// (kPacks * kCount <= 64 of them) in fp32 and the lanes' sums are added in double, a
// relative error <= 64 * 2^-24 = 3.8e-6 of the sum of the terms' magnitudes, a few
// thousandths of dinp's bf16 (2^-9) or fp16 (2^-12) rounding, where a double per term
// took two conversions an element (Hopper converts at a quarter of its double-add rate).
// fp32 keeps a double per term. Each lane keeps fp32 column sums of its own packs'
// columns across its rows; the block then writes one partial row per gradient.
template <class T, int kPacks>
__global__ void __launch_bounds__(kBackwardWarps * kWarpSize)
    layernorm_backward_warp_kernel(float* __restrict__ weight_partials,
                                   float* __restrict__ bias_partials,
                                   LayerNormBackwardArgs<T> p, bool accumulate_dinp,
                                   int chunk_rows) {
  constexpr int kCount = Pack<T>::kCount;
  using LaneSum = std::conditional_t<std::is_same_v<T, float>, double, float>;
  extern __shared__ float4 shared_float4s[];  // float4 for the alignment of the stores
  float* warp_sums = reinterpret_cast<float*>(shared_float4s);
  const int lane = threadIdx.x % kWarpSize;
  const int chunk = blockIdx.x;
  const int row_end = min(p.rows, (chunk + 1) * chunk_rows);
  const auto for_each_pack = [&](auto f) {
    for_each_lane_pack<kPacks, kCount>(lane, p.channels, f);
  };
  float weight_sums[kPacks][kCount] = {};
  float bias_sums[kPacks][kCount] = {};
  for (int row = chunk * chunk_rows + threadIdx.x / kWarpSize; row < row_end;
       row += kBackwardWarps) {
    const size_t offset = size_t(row) * p.channels;
    Pack<T> x[kPacks], dy[kPacks], dx[kPacks];
    for_each_pack([&](int k, int column) {
      x[k] = load_pack(p.inp + offset + column);
      dy[k] = load_pack(p.dout + offset + column);
      if (accumulate_dinp) dx[k] = load_pack(p.dinp + offset + column);
    });
    const float row_mean = p.mean[row];
    const float row_rstd = p.rstd[row];
    // Calls f(i, normed, dnorm, upstream) for each element i of pack k: its normalised
    // input, weight * dy, and dy.
    const auto for_each_element = [&](int k, int column, auto f) {
      float weight[kCount];
      load_parameters(weight, p.weight + column);
#pragma unroll
      for (int i = 0; i < kCount; ++i) {
        const float normed = normalized(x[k].get(i), row_mean, row_rstd);
        const float upstream = dy[k].get(i);
        f(i, normed, __fmul_rn(weight[i], upstream), upstream);
      }
    };
    LaneSum dnorm_total = 0, dnorm_dot_norm = 0;
    for_each_pack([&](int k, int column) {
      for_each_element(k, column, [&](int, float normed, float dnorm, float) {
        dnorm_total += dnorm;
        dnorm_dot_norm += static_cast<LaneSum>(dnorm) * normed;
      });
    });
    const float dnorm_mean =
        static_cast<float>(warp_reduce_sum(static_cast<double>(dnorm_total)) / p.channels);
    const float dnorm_norm_mean =
        static_cast<float>(warp_reduce_sum(static_cast<double>(dnorm_dot_norm)) / p.channels);
    for_each_pack([&](int k, int) {
      hide_from_compiler(x[k]);
      hide_from_compiler(dy[k]);
    });
    for_each_pack([&](int k, int column) {
      for_each_element(k, column, [&](int i, float normed, float dnorm, float upstream) {
        const float centered = __fsub_rn(dnorm - dnorm_mean, __fmul_rn(normed, dnorm_norm_mean));
        const float gradient = __fmul_rn(row_rstd, centered);
        dx[k].set(i, accumulate_dinp ? __fadd_rn(dx[k].get(i), gradient) : gradient);
        weight_sums[k][i] = __fadd_rn(weight_sums[k][i], __fmul_rn(normed, upstream));
        bias_sums[k][i] += upstream;
      });
      store_pack(p.dinp + offset + column, dx[k]);
    });
  }
  const size_t partial_offset = size_t(chunk) * p.channels;
  write_block_partial_row(weight_partials + partial_offset, weight_sums, warp_sums, p.channels);
  write_block_partial_row(bias_partials + partial_offset, bias_sums, warp_sums, p.channels);
}

void check_shape(int rows, int channels) {
  check_positive(rows, "layernorm rows");
  check_positive(channels, "layernorm channels");
}

// Packs per lane of a warp-per-row kernel, or 0 where the row cannot take one: C not a
// whole number of packs, an operand not 16-byte aligned, or a row too wide for registers.
template <class T>
int warp_row_packs_per_lane(int channels, std::initializer_list<const void*> operands) {
  if (channels % Pack<T>::kCount != 0) return 0;
  for (const void* operand : operands) {
    if (!aligned16(operand)) return 0;
  }
  const int packs_per_lane = (channels / Pack<T>::kCount + kWarpSize - 1) / kWarpSize;
  return packs_per_lane <= kMaxPacksPerLane ? packs_per_lane : 0;
}

// Calls launch(std::integral_constant<int, n>{}) for n = packs_per_lane, in
// 1..kMaxPacksPerLane: the kernels size their register arrays by it.
template <int kPacks = 1, class Launch>
void with_packs_per_lane(int packs_per_lane, const Launch& launch) {
  if constexpr (kPacks < kMaxPacksPerLane) {
    if (packs_per_lane > kPacks) {
      with_packs_per_lane<kPacks + 1>(packs_per_lane, launch);
      return;
    }
  }
  launch(std::integral_constant<int, kPacks>{});
}

int backward_chunks(int rows) {
  const int chunk_rows = backward_chunk_rows(rows);
  return (rows + chunk_rows - 1) / chunk_rows;
}

}  // namespace

// out = layernorm(inp): a warp a row where the rows allow it, a block a row otherwise.
template <class T>
void launch_layernorm_forward(cudaStream_t stream, const LayerNormForwardArgs<T>& args) {
  const auto& [out, mean, rstd, inp, weight, bias, rows, channels, out_stride] = args;
  check_shape(rows, channels);
  check_not_null({{out, "layernorm out"},
                  {mean, "layernorm mean"},
                  {rstd, "layernorm rstd"},
                  {inp, "layernorm inp"},
                  {weight, "layernorm weight"},
                  {bias, "layernorm bias"}});
  // Augmented rows start 16 bytes apart where the stride is a whole number of packs.
  check_row_stride(out_stride, channels, "layernorm out");
  const bool packed_rows = out_stride % Pack<T>::kCount == 0;
  const int packs_per_lane =
      packed_rows ? warp_row_packs_per_lane<T>(channels, {out, inp, weight, bias}) : 0;
  if (packs_per_lane == 0) {
    layernorm_forward_kernel<T><<<rows, kRowThreads, 0, stream>>>(args);
    CHECK_LAUNCH();
    return;
  }
  const int blocks = (rows + kForwardWarps - 1) / kForwardWarps;
  with_packs_per_lane(packs_per_lane, [&](auto packs) {
    constexpr int kPacks = decltype(packs)::value;
    layernorm_forward_warp_kernel<T, kPacks><<<blocks, kForwardWarps * kWarpSize, 0, stream>>>(args);
    CHECK_LAUNCH();
  });
}

size_t layernorm_backward_scratch_elems(int rows, int channels) {
  // Either path may run, depending on the pointers' alignment.
  const int partial_rows = std::max(column_partial_rows(rows), backward_chunks(rows));
  return 2 * size_t(partial_rows) * size_t(channels);
}

template <class T>
void launch_layernorm_backward(cudaStream_t stream, const LayerNormBackwardArgs<T>& args,
                               Scratch scratch) {
  const auto& [dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels, dinp_write] =
      args;
  // The kernels take dinp_write as a bool: read as the 32-bit enum, it makes nvcc order the
  // warp kernel's loads and arithmetic otherwise than tuned.
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  check_shape(rows, channels);
  check_not_null({{dinp, "layernorm dinp"},
                  {dweight, "layernorm dweight"},
                  {dbias, "layernorm dbias"},
                  {dout, "layernorm dout"},
                  {inp, "layernorm inp"},
                  {weight, "layernorm weight"},
                  {mean, "layernorm mean"},
                  {rstd, "layernorm rstd"},
                  {scratch.data, "layernorm scratch"}});
  SCALESTUDY_CHECK(scratch.elems >= layernorm_backward_scratch_elems(rows, channels),
                   "layernorm backward: scratch too small");
  SCALESTUDY_CHECK(column_partial_rows(rows) <= 65535,
                   "layernorm backward: too many rows for the grid");
  const int packs_per_lane = warp_row_packs_per_lane<T>(channels, {dinp, dout, inp, weight});
  const int chunk_rows = backward_chunk_rows(rows);
  const int partial_rows = packs_per_lane > 0 ? backward_chunks(rows) : column_partial_rows(rows);
  float* weight_partials = scratch.data;
  float* bias_partials = scratch.data + size_t(partial_rows) * channels;

  if (packs_per_lane > 0) {
    const size_t shared_bytes = size_t(kBackwardWarps) * channels * sizeof(float);
    with_packs_per_lane(packs_per_lane, [&](auto packs) {
      constexpr int kPacks = decltype(packs)::value;
      const auto kernel = layernorm_backward_warp_kernel<T, kPacks>;
      // Beyond 48 KiB a kernel must opt in; only rows over 1536 channels get there.
      if (shared_bytes > kDefaultSharedBytes) {
        CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
      }
      kernel<<<partial_rows, kBackwardWarps * kWarpSize, shared_bytes, stream>>>(
          weight_partials, bias_partials, args, accumulate_dinp, chunk_rows);
      CHECK_LAUNCH();
    });
  } else {
    layernorm_backward_input_kernel<T><<<rows, kRowThreads, 0, stream>>>(args, accumulate_dinp);
    CHECK_LAUNCH();
    const dim3 grid((channels + kColumnTile - 1) / kColumnTile, partial_rows);
    const dim3 block(kColumnTile, kColumnRowLanes);
    layernorm_backward_param_partials_kernel<T><<<grid, block, 0, stream>>>(weight_partials,
                                                                            bias_partials, args);
    CHECK_LAUNCH();
  }
  launch_add_column_partials(stream, dweight, weight_partials, partial_rows, channels, dbias,
                             bias_partials);
}

// The storage types the backend runs LayerNorm in.
#define SCALESTUDY_LAYERNORM_INSTANCES(T)                                                          \
  template void launch_layernorm_forward(cudaStream_t, const LayerNormForwardArgs<T>&);            \
  template void launch_layernorm_backward(cudaStream_t, const LayerNormBackwardArgs<T>&, Scratch);
SCALESTUDY_FOR_EACH_STORAGE(SCALESTUDY_LAYERNORM_INSTANCES)
#undef SCALESTUDY_LAYERNORM_INSTANCES

}  // namespace scalestudy::cuda
