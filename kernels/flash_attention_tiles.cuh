#pragma once
// The tiles of the fused attention (flash_attention.cu): its shape constants and the
// warp-level building blocks (mma.m16n8k16, ldmatrix, the fragment layouts, masking)
// that its kernels share; its cp.async copies are common.cuh's. Included by
// flash_attention.cu only.
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// Tiling. Every kernel runs 4 warps over 64-row tiles of keys (and, in the dK/dV kernel,
// of queries). A warp owns kM m-tiles of 16 rows of the block's own side (queries in the
// forward and dQ kernels, keys in the dK/dV kernel) and the whole 64-wide other side.
// With the head size also 64, every warp-level product below is kM 16x64 by 64x64 ones:
// 4 k-steps by 8 n-tiles of mma.m16n8k16, so one fragment layout serves all of them.
// Each B fragment read from shared memory feeds kM products. The query-side kernels give
// each warp 32 rows (kM = 2): the dQ kernel runs faster for it, the forward no slower.
// The dK/dV kernel's accumulators leave no registers for a second m-tile.
constexpr int kHeadSize = 64;
constexpr int kTileRows = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kKSteps = kHeadSize / 16;   // k-steps of 16 in a product over the head
constexpr int kNTiles = kTileRows / 8;    // n-tiles of 8 in a 64-wide result
static_assert(kHeadSize == kTileRows, "the fragment helpers assume square 64x64 tiles");

// Shared-memory tiles are row-major with 16 bytes of padding per row: ldmatrix reads 8 rows
// of 16 bytes per matrix, and a 144-byte stride puts them in 8 different bank groups.
constexpr int kSmemStride = kHeadSize + 8;  // elements of T
constexpr int kTileElems = kTileRows * kSmemStride;
// fp32 staging rows of the backward's results: 72 floats keep a half-warp's float2
// stores (4 rows x 4 column pairs) in distinct banks. A 64-row staging tile takes exactly
// the bytes of two 16-bit tiles.
constexpr int kStageStride = kHeadSize + 8;  // floats
static_assert(kTileRows * kStageStride * 4 == 2 * kTileElems * 2, "staging fits two tiles");

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---- warp-level building blocks -------------------------------------------------------

// Two floats rounded to T, the lower column in the low half (the mma operand order).
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    const __half2 pair = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&pair);
  }
}

// c += a * b for one m16n8k16 tile: a 16x16 row-major, b 16x8 column-major, c fp32.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row addresses of
// matrix i. Plain: lane l receives row l/4, columns 2(l%4) and +1 of each matrix.
// kTranspose: row and column swapped (column l/4, rows 2(l%4) and +1). volatile keeps the
// reads between the barriers that guard the tiles.
template <bool kTranspose>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kTranspose)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// Rows [row0, row0 + kRows) of one head of a [seq, ld] matrix (head columns at `base`)
// into a padded tile; rows from seq on are zero-filled.
template <int kRows = kTileRows, class T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* base, int row0, int seq,
                                                size_t ld) {
  constexpr int kChunksPerRow = kHeadSize * int(sizeof(T)) / 16;
#pragma unroll
  for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
    const int chunk = threadIdx.x + i * kThreads;
    const int r = chunk / kChunksPerRow, c = chunk % kChunksPerRow;
    const int row = row0 + r;
    const bool valid = row < seq;
    copy_async_16(tile + r * kSmemStride + c * 8, base + size_t(valid ? row : 0) * ld + c * 8,
                  valid);
  }
}

// 64 fp32 values of a per-row vector ([seq] at `base`), zero past seq.
__device__ __forceinline__ void load_row_values_async(float* values, const float* base, int row0,
                                                      int seq) {
  if (threadIdx.x < kTileRows) {
    const int row = row0 + threadIdx.x;
    const bool valid = row < seq;
    copy_async_4(values + threadIdx.x, base + (valid ? row : 0), valid);
  }
}

// A warp's operands and results: kM m-tiles of 16 rows, as A fragments over the 64-wide
// head (4 k-steps) or as fp32 accumulators over 64 columns (8 n-tiles).
template <int kM>
using Fragments = uint32_t[kM][kKSteps][4];
template <int kM>
using Accumulators = float[kM][kNTiles][4];

// A fragments of rows [row0, row0 + 16 kM) of a tile.
template <int kM, class T>
__device__ __forceinline__ void load_a_fragments(Fragments<kM>& a, const T* tile, int row0) {
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
      ldmatrix_x4<false>(a[m][kk], tile + (row0 + m * 16 + lane % 16) * kSmemStride + kk * 16 +
                                       (lane / 16) * 8);
  }
}

// acc[16kM x 64] += A[16kM x 64] * B, B's fragments read from a 64 x 64 tile.
// kTileIsBTransposed: B = tile^T, the tile holding the 64 columns of the result as its rows
// (S = Q K^T, dP = dO V^T and their transposes); a B fragment (k = tile column, n = tile
// row) is a plain ldmatrix of the tile. Otherwise B = tile, the tile's rows being the k
// dimension (O = P V, dV = P^T dO, dK = dS^T Q, dQ = dS K); a fragment is a transposing
// ldmatrix.
template <bool kTileIsBTransposed, int kM, class T>
__device__ __forceinline__ void mma_tile(Accumulators<kM>& acc, const Fragments<kM>& a,
                                         const T* tile) {
  const int lane = threadIdx.x % kWarpSize;
  const T* lane_row =
      kTileIsBTransposed
          ? tile + ((lane % 8) + (lane / 16) * 8) * kSmemStride + ((lane / 8) % 2) * 8
          : tile + ((lane % 8) + ((lane / 8) % 2) * 8) * kSmemStride + (lane / 16) * 8;
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int pair = 0; pair < kNTiles / 2; ++pair) {
      uint32_t b[4];
      if constexpr (kTileIsBTransposed)
        ldmatrix_x4<false>(b, lane_row + pair * 16 * kSmemStride + kk * 16);
      else
        ldmatrix_x4<true>(b, lane_row + kk * 16 * kSmemStride + pair * 16);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma_16816<T>(acc[m][2 * pair], a[m][kk], b[0], b[1]);
        mma_16816<T>(acc[m][2 * pair + 1], a[m][kk], b[2], b[3]);
      }
    }
  }
}

// acc += A * tile^T (S = Q K^T, dP = dO V^T and their transposes).
template <int kM, class T>
__device__ __forceinline__ void mma_a_tile_transposed(Accumulators<kM>& acc,
                                                      const Fragments<kM>& a, const T* tile) {
  mma_tile<true, kM>(acc, a, tile);
}

// acc += A * tile (O = P V, dV = P^T dO, dK = dS^T Q, dQ = dS K).
template <int kM, class T>
__device__ __forceinline__ void mma_a_tile(Accumulators<kM>& acc, const Fragments<kM>& a,
                                           const T* tile) {
  mma_tile<false, kM>(acc, a, tile);
}

// Calls f(m, nt, i) for i < kPerTile in each n-tile nt of each m-tile m of a warp's
// accumulator tiles.
template <int kM, int kPerTile, class F>
__device__ __forceinline__ void for_each_tile_index(F f) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int i = 0; i < kPerTile; ++i) f(m, nt, i);
    }
  }
}

// Calls f(m, nt, e) for every element [m][nt][e] of a warp's accumulator tiles, e being
// the element of the lane's four.
template <int kM, class F>
__device__ __forceinline__ void for_each_accumulator(F f) {
  for_each_tile_index<kM, 4>(f);
}

// Calls f(m, nt, r) for every pair of neighbouring elements [m][nt][2r], [m][nt][2r + 1] of
// a warp's accumulator tiles, r (0 or 1) naming which of the lane's two rows of m-tile m
// the pair lies in.
template <int kM, class F>
__device__ __forceinline__ void for_each_accumulator_pair(F f) {
  for_each_tile_index<kM, 2>(f);
}

// Calls f(value, m, r) on every element of a warp's accumulator tiles, r (0 or 1) naming
// which of the lane's two rows of m-tile m the element lies in.
template <int kM, class F>
__device__ __forceinline__ void for_each_element(Accumulators<kM>& acc, F f) {
  for_each_accumulator<kM>([&](int m, int nt, int e) { f(acc[m][nt][e], m, e / 2); });
}

// fp32 accumulator tiles [16 x 64] as A fragments over their 64 columns, rounded to T:
// the accumulator layout of two neighbouring n-tiles is the A layout of one k-step, so
// the probabilities (or dS) never leave registers.
template <class T, int kM>
__device__ __forceinline__ void accumulators_to_a_fragments(Fragments<kM>& a,
                                                            const Accumulators<kM>& acc) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      a[m][kk][0] = pack_pair<T>(acc[m][2 * kk][0], acc[m][2 * kk][1]);
      a[m][kk][1] = pack_pair<T>(acc[m][2 * kk][2], acc[m][2 * kk][3]);
      a[m][kk][2] = pack_pair<T>(acc[m][2 * kk + 1][0], acc[m][2 * kk + 1][1]);
      a[m][kk][3] = pack_pair<T>(acc[m][2 * kk + 1][2], acc[m][2 * kk + 1][3]);
    }
  }
}

// Accumulator element (nt, e) of a lane lies in row (lane/4) + 8*(e/2) of the warp's 16
// and column nt*8 + 2*(lane%4) + e%2 of the 64.
__device__ __forceinline__ int accumulator_row(int e) {
  return (threadIdx.x % kWarpSize) / 4 + (e / 2) * 8;
}
__device__ __forceinline__ int accumulator_column(int nt, int e) {
  return nt * 8 + 2 * (threadIdx.x % 4) + e % 2;
}

// The 4 lanes that share an accumulator row, combined in a fixed order.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullWarpMask, x, 1);
  return x + __shfl_xor_sync(kFullWarpMask, x, 2);
}

// Whether query `query` sees key `key`: not a later key (causal), neither past the
// sequence.
__device__ __forceinline__ bool visible(int query, int key, int seq, bool causal) {
  return query < seq && key < seq && (!causal || key <= query);
}

// Hides (sets to -inf, which exp2 turns into exact zeros) the scores of a warp's
// accumulator tiles (rows from row0) that the mask removes: keys after the query
// (causal), and keys or queries past the sequence. kKeysAsRows: the tiles are transposed
// (dK/dV kernel).
template <bool kKeysAsRows, int kM>
__device__ __forceinline__ void mask_scores(Accumulators<kM>& s, int row0, int column0, int seq,
                                            bool causal) {
  for_each_accumulator<kM>([&](int m, int nt, int e) {
    const int row = row0 + m * 16 + accumulator_row(e);
    const int column = column0 + accumulator_column(nt, e);
    if (!(kKeysAsRows ? visible(column, row, seq, causal) : visible(row, column, seq, causal)))
      s[m][nt][e] = -INFINITY;
  });
}

// The key and value tiles of one head, streamed through a double buffer: while tile j is
// in use, tile j + 1 is being copied.
template <class T>
struct KeyValueStream {
  T* k_tiles;  // [2][kTileElems]
  T* v_tiles;  // [2][kTileElems]
  const T* k_base;
  const T* v_base;
  int seq;
  size_t ld;
  int tiles;

  __device__ void load(int j) const {
    load_tile_async(k_tiles + (j % 2) * kTileElems, k_base, j * kTileRows, seq, ld);
    load_tile_async(v_tiles + (j % 2) * kTileElems, v_base, j * kTileRows, seq, ld);
    copy_async_commit();
  }
  // Makes tile j (whose copy load(j) started) visible to the block, after starting tile
  // j + 1 in the other buffer. The caller ends each iteration with a barrier, so that
  // buffer is no longer read.
  __device__ void acquire(int j) const {
    if (j + 1 < tiles) {
      load(j + 1);
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();
  }
  __device__ const T* keys(int j) const { return k_tiles + (j % 2) * kTileElems; }
  __device__ const T* values(int j) const { return v_tiles + (j % 2) * kTileElems; }
};

}  // namespace
}  // namespace scalestudy::cuda
