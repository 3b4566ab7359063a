#include "flash_attention.cuh"

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "flash_attention_tiles.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// ---- forward ----------------------------------------------------------------------------

template <class T>
struct FlashForwardParams {
  T* out;
  float* lse;
  const T* qkv;
  int seq;
  int channels;
  int heads;
  bool causal;
  float score_scale_log2;  // log2(e) / sqrt(HS): scores go straight into exp2
};

// The query-side kernels (forward, dQ) give each warp 32 query rows, so a block covers
// 128 queries against 64-key tiles.
constexpr int kQueryMTiles = 2;
constexpr int kQueryBlockRows = kWarps * 16 * kQueryMTiles;
constexpr int kQueryBlockElems = kQueryBlockRows * kSmemStride;

constexpr size_t kForwardSmemBytes = (kQueryBlockElems + 4 * kTileElems) * 2;  // Q, K and V twice

// Whether key tile j holds a key that a query of rows [row0, row0 + rows) must not see:
// a later key (causal) or one past the sequence.
__device__ __forceinline__ bool key_tile_masked(int j, int row0, int seq, bool causal) {
  return (causal && (j + 1) * kTileRows - 1 > row0) || (j + 1) * kTileRows > seq;
}

// Where a block of the forward or dQ kernel works: its batch entry and head, the first
// query row of its block (the last query blocks see the most keys, so they are launched
// first), its warp's first row within the block and the last query that warp holds, the
// distance between qkv's rows, its head's Q columns, and the key tiles its queries see.
template <class T>
struct QueryBlock {
  int b, h, q0, warp_row0, warp_last_query;
  size_t ld;
  const T* q_base;
  int kv_tiles;
};

template <class Params>
__device__ __forceinline__ auto query_block_of(const Params& p) {
  constexpr int kM = kQueryMTiles;
  const int warp = threadIdx.x / kWarpSize;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int q_block = gridDim.y - 1 - blockIdx.y;
  const int q0 = q_block * kQueryBlockRows;
  const int warp_row0 = warp * 16 * kM;  // within the block
  const int warp_last_query = q0 + warp_row0 + 16 * kM - 1;
  const size_t ld = 3 * size_t(p.channels);
  const auto* q_base = p.qkv + size_t(b) * p.seq * ld + size_t(h) * kHeadSize;
  const int seq_tiles = ceil_div(p.seq, kTileRows);
  const int kv_tiles =
      p.causal ? min(seq_tiles, ceil_div(q0 + kQueryBlockRows, kTileRows)) : seq_tiles;
  using T = std::remove_const_t<std::remove_pointer_t<decltype(q_base)>>;
  return QueryBlock<T>{b, h, q0, warp_row0, warp_last_query, ld, q_base, kv_tiles};
}

// One block per (128-query block, batch*head). The key/value tiles stream through a
// double buffer (the next one is copied while this one is used). Per query row the
// running max m and sum l of exp2(score - m) rescale the output accumulator whenever m
// grows; only the tiles a row can see are visited, so causal blocks stop at their
// diagonal, and a warp skips the tiles that lie wholly after its rows.
template <class T>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(FlashForwardParams<T> p) {
  constexpr int kM = kQueryMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);
  T* k_tiles = q_tile + kQueryBlockElems;
  T* v_tiles = k_tiles + 2 * kTileElems;
  const int lane = threadIdx.x % kWarpSize;
  const auto [b, h, q0, warp_row0, warp_last_query, ld, q_base, kv_tiles] = query_block_of(p);
  const int bh = blockIdx.x;
  const T* k_base = q_base + p.channels;
  const T* v_base = q_base + 2 * p.channels;

  load_tile_async<kQueryBlockRows>(q_tile, q_base, q0, p.seq, ld);
  copy_async_commit();
  load_tile_async(k_tiles, k_base, 0, p.seq, ld);
  load_tile_async(v_tiles, v_base, 0, p.seq, ld);
  copy_async_commit();
  copy_async_wait<1>();
  __syncthreads();
  Fragments<kM> q_frag;
  load_a_fragments<kM>(q_frag, q_tile, warp_row0);

  Accumulators<kM> o = {};
  float row_max[kM][2], row_sum[kM][2];  // row_max in the log2 domain; row_sum this lane's part
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_max[m][r] = -INFINITY;
      row_sum[m][r] = 0.0f;
    }
  }
  for (int j = 0; j < kv_tiles; ++j) {
    // KeyValueStream::acquire written out: with nvcc 13.0 the struct form made this
    // kernel markedly slower (different register allocation), the dQ kernel no slower.
    if (j + 1 < kv_tiles) {
      const int next = (j + 1) % 2;
      load_tile_async(k_tiles + next * kTileElems, k_base, (j + 1) * kTileRows, p.seq, ld);
      load_tile_async(v_tiles + next * kTileElems, v_base, (j + 1) * kTileRows, p.seq, ld);
      copy_async_commit();
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();
    // Causal: a tile wholly after the warp's last query adds nothing to its rows.
    if (!p.causal || j * kTileRows <= warp_last_query) {
      const T* k_tile = k_tiles + (j % 2) * kTileElems;
      const T* v_tile = v_tiles + (j % 2) * kTileElems;
      Accumulators<kM> s = {};
      mma_a_tile_transposed<kM>(s, q_frag, k_tile);
      if (key_tile_masked(j, q0 + warp_row0, p.seq, p.causal))
        mask_scores<false>(s, q0 + warp_row0, j * kTileRows, p.seq, p.causal);
      // The scores stay unscaled: the scale (> 0) keeps their order, so the maximum is
      // taken first and scaled once, and each exponent is one fma of score and scale.
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        float rescale[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float tile_max = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
            tile_max = fmaxf(tile_max, fmaxf(s[m][nt][2 * r], s[m][nt][2 * r + 1]));
          tile_max = fmaxf(row_max[m][r], quad_max(tile_max) * p.score_scale_log2);
          // A row with nothing visible yet keeps max -inf; exponentiating against 0
          // instead gives exact zeros rather than NaN from -inf - -inf.
          base[r] = tile_max == -INFINITY ? 0.0f : tile_max;
          rescale[r] = exp2_flush_to_zero(row_max[m][r] - base[r]);
          row_max[m][r] = tile_max;
          row_sum[m][r] *= rescale[r];
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[m][nt][e] =
                exp2_flush_to_zero(fmaf(s[m][nt][e], p.score_scale_log2, -base[e / 2]));
            row_sum[m][e / 2] += s[m][nt][e];
            o[m][nt][e] *= rescale[e / 2];
          }
        }
      }
      Fragments<kM> p_frag;
      accumulators_to_a_fragments<T>(p_frag, s);
      mma_a_tile<kM>(o, p_frag, v_tile);
    }
    // The next iteration's copies overwrite the buffer read here.
    __syncthreads();
  }

  // Stage the warp's output rows in its own rows of the Q tile (only this warp ever read
  // them) so that the global stores are whole 16-byte row pieces.
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float inverse_sum[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = quad_sum(row_sum[m][r]);
      inverse_sum[r] = total > 0.0f ? 1.0f / total : 0.0f;
      const int row = q0 + warp_row0 + m * 16 + accumulator_row(2 * r);
      if (lane % 4 == 0 && row < p.seq)
        p.lse[size_t(bh) * p.seq + row] = (row_max[m][r] + log2f(total)) * kLn2;
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        *reinterpret_cast<uint32_t*>(
            q_tile + (warp_row0 + m * 16 + accumulator_row(2 * r)) * kSmemStride +
            accumulator_column(nt, 0)) =
            pack_pair<T>(o[m][nt][2 * r] * inverse_sum[r], o[m][nt][2 * r + 1] * inverse_sum[r]);
      }
    }
  }
  __syncwarp();
  constexpr int kChunksPerRow = kHeadSize / 8;
#pragma unroll
  for (int i = 0; i < 16 * kM * kChunksPerRow / kWarpSize; ++i) {
    const int chunk = lane + i * kWarpSize;
    const int r = warp_row0 + chunk / kChunksPerRow, c = chunk % kChunksPerRow;
    const int row = q0 + r;
    if (row < p.seq) {
      T* dst = p.out + (size_t(b) * p.seq + row) * p.channels + size_t(h) * kHeadSize + c * 8;
      *reinterpret_cast<int4*>(dst) =
          *reinterpret_cast<const int4*>(q_tile + r * kSmemStride + c * 8);
    }
  }
}

// ---- backward ---------------------------------------------------------------------------
// Two kernels: dQ per query tile, which also computes the softmax backward's per-row term
// D = rowsum(dout * out) of its rows; then dK and dV per key tile, which reads D. Each
// gradient element is owned by one thread and summed in a fixed order (no atomics, so the
// result is bit-reproducible), at the price of computing S and dP in both kernels.

template <class T>
struct FlashBackwardParams {
  T* dqkv;
  const T* dout;
  const T* qkv;
  const T* out;
  const float* lse;
  float* dsum;  // D = rowsum(dout * out), [B*NH, seq], in the scratch; the dQ kernel writes it
  int seq;
  int channels;
  int heads;
  bool causal;
  float score_scale;       // 1/sqrt(HS)
  float score_scale_log2;  // log2(e)/sqrt(HS)
  bool accumulate;         // dqkv += the gradients; otherwise dqkv = them, unread
};

// dst[kRows rows x HS] += the fp32 staging tile, read, summed in fp32 and rounded once,
// or, without accumulate, dst = the tile rounded once; rows past seq are skipped. dst
// points at row 0, column 0 of the head in dqkv.
template <int kRows, class T>
__device__ __forceinline__ void write_staged_tile(T* dst, size_t ld, const float* stage, int row0,
                                                  int seq, bool accumulate) {
  constexpr int kChunksPerRow = kHeadSize / Pack<T>::kCount;
#pragma unroll 2
  for (int chunk = threadIdx.x; chunk < kRows * kChunksPerRow; chunk += kThreads) {
    const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * Pack<T>::kCount;
    if (row0 + r >= seq) continue;
    T* at = dst + size_t(row0 + r) * ld + c;
    Pack<T> sum{};
    if (accumulate) sum = load_pack(at);
    const float* staged = stage + r * kStageStride + c;
#pragma unroll
    for (int i = 0; i < Pack<T>::kCount; ++i)
      sum.set(i, accumulate ? sum.get(i) + staged[i] : staged[i]);
    store_pack(at, sum);
  }
}

// Writes a warp's accumulator tiles [16kM x 64] (scaled) into rows warp*16kM.. of the
// staging.
template <int kM>
__device__ __forceinline__ void stage_accumulators(float* stage, const Accumulators<kM>& acc,
                                                   float scale) {
  const int warp = threadIdx.x / kWarpSize;
  for_each_accumulator_pair<kM>([&](int m, int nt, int r) {
    *reinterpret_cast<float2*>(stage +
                               ((warp * kM + m) * 16 + accumulator_row(2 * r)) * kStageStride +
                               accumulator_column(nt, 0)) =
        make_float2(acc[m][nt][2 * r] * scale, acc[m][nt][2 * r + 1] * scale);
  });
}

constexpr size_t kKeyValueSmemBytes = 6 * kTileElems * 2 + 4 * kTileRows * sizeof(float);

// dK and dV of one 64-key tile: one block per (key tile, batch*head), looping over the
// query tiles that see it (causal: from the diagonal on) with Q, dO, lse and D double
// buffered. Each warp holds 16 keys; everything is computed transposed (keys as rows):
//   P^T = exp2(K Q^T * scale*log2e - lse*log2e)    (recomputed from the forward's lse)
//   dV += P^T dO;  dP^T = V dO^T;  dS^T = P^T (dP^T - D);  dK += dS^T Q  (scale at the end)
template <class T>
__global__ void __launch_bounds__(kThreads) flash_backward_key_value_kernel(
    FlashBackwardParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_tile = reinterpret_cast<T*>(smem);
  T* v_tile = k_tile + kTileElems;
  T* q_tiles = v_tile + kTileElems;
  T* dout_tiles = q_tiles + 2 * kTileElems;
  float* lse_values = reinterpret_cast<float*>(dout_tiles + 2 * kTileElems);  // [2][64]
  float* dsum_values = lse_values + 2 * kTileRows;                          // [2][64]
  const int warp = threadIdx.x / kWarpSize;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  // Causal: the first key tiles are seen by the most query tiles, and y runs slowest in
  // the launch order, so the heaviest blocks start first.
  const int key_tile_index = blockIdx.y;
  const int k0 = key_tile_index * kTileRows;
  const size_t ld = 3 * size_t(p.channels);
  const T* q_base = p.qkv + size_t(b) * p.seq * ld + size_t(h) * kHeadSize;
  const T* dout_base = p.dout + size_t(b) * p.seq * p.channels + size_t(h) * kHeadSize;
  const float* lse_base = p.lse + size_t(bh) * p.seq;
  const float* dsum_base = p.dsum + size_t(bh) * p.seq;
  const int q_tiles_total = ceil_div(p.seq, kTileRows);
  const int first_q_tile = p.causal ? key_tile_index : 0;

  auto load_query_side = [&](int q_tile_index, int buffer) {
    const int q0 = q_tile_index * kTileRows;
    load_tile_async(q_tiles + buffer * kTileElems, q_base, q0, p.seq, ld);
    load_tile_async(dout_tiles + buffer * kTileElems, dout_base, q0, p.seq, size_t(p.channels));
    load_row_values_async(lse_values + buffer * kTileRows, lse_base, q0, p.seq);
    load_row_values_async(dsum_values + buffer * kTileRows, dsum_base, q0, p.seq);
  };
  load_tile_async(k_tile, q_base + p.channels, k0, p.seq, ld);
  load_tile_async(v_tile, q_base + 2 * p.channels, k0, p.seq, ld);
  copy_async_commit();
  load_query_side(first_q_tile, 0);
  copy_async_commit();
  copy_async_wait<1>();
  __syncthreads();
  Fragments<1> k_frag, v_frag;
  load_a_fragments<1>(k_frag, k_tile, warp * 16);
  load_a_fragments<1>(v_frag, v_tile, warp * 16);

  Accumulators<1> dk = {}, dv = {};
  for (int i = first_q_tile; i < q_tiles_total; ++i) {
    const int buffer = (i - first_q_tile) % 2;
    if (i + 1 < q_tiles_total) {
      load_query_side(i + 1, 1 - buffer);
      copy_async_commit();
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();
    const T* q_tile = q_tiles + buffer * kTileElems;
    const T* dout_tile = dout_tiles + buffer * kTileElems;
    const float* lse_tile = lse_values + buffer * kTileRows;
    const float* dsum_tile = dsum_values + buffer * kTileRows;
    // Masks: the diagonal tile (causal) and a tile running past the sequence.
    const bool masked = (p.causal && i == key_tile_index) || (i + 1) * kTileRows > p.seq;

    Accumulators<1> s = {};
    mma_a_tile_transposed<1>(s, k_frag, q_tile);
    if (masked) mask_scores<true>(s, k0 + warp * 16, i * kTileRows, p.seq, p.causal);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const float2 lse = *reinterpret_cast<const float2*>(lse_tile + accumulator_column(nt, 0));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float query_lse = e % 2 == 0 ? lse.x : lse.y;
        s[0][nt][e] =
            exp2_flush_to_zero(fmaf(s[0][nt][e], p.score_scale_log2, -query_lse * kLog2e));
      }
    }
    Fragments<1> frag;
    accumulators_to_a_fragments<T>(frag, s);
    mma_a_tile<1>(dv, frag, dout_tile);

    Accumulators<1> dp = {};
    mma_a_tile_transposed<1>(dp, v_frag, dout_tile);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const float2 dsum = *reinterpret_cast<const float2*>(dsum_tile + accumulator_column(nt, 0));
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dp[0][nt][e] = s[0][nt][e] * (dp[0][nt][e] - (e % 2 == 0 ? dsum.x : dsum.y));
    }
    accumulators_to_a_fragments<T>(frag, dp);
    mma_a_tile<1>(dk, frag, q_tile);
    // The next iteration's copies overwrite the buffers read here.
    __syncthreads();
  }

  // The loop ended with a barrier, so the Q and dO buffers are free for the fp32 staging.
  float* dk_stage = reinterpret_cast<float*>(q_tiles);
  float* dv_stage = dk_stage + kTileRows * kStageStride;
  stage_accumulators<1>(dk_stage, dk, p.score_scale);
  stage_accumulators<1>(dv_stage, dv, 1.0f);
  __syncthreads();
  T* dkey = p.dqkv + size_t(b) * p.seq * ld + p.channels + size_t(h) * kHeadSize;
  write_staged_tile<kTileRows>(dkey, ld, dk_stage, k0, p.seq, p.accumulate);
  write_staged_tile<kTileRows>(dkey + p.channels, ld, dv_stage, k0, p.seq, p.accumulate);
}

constexpr size_t kQuerySmemBytes = (2 * kQueryBlockElems + 4 * kTileElems) * 2 + kQueryBlockRows * 4;
static_assert(kQueryBlockRows * kStageStride * 4 <= 2 * kQueryBlockElems * 2,
              "the dQ staging fits the Q and dO tiles");

// dQ of one 128-query block: one block per (query block, batch*head), looping over the
// key tiles it sees with K and V double buffered, as the forward does:
//   P = exp2(Q K^T * scale*log2e - lse*log2e);  dP = dO V^T;  dS = P (dP - D);  dQ += dS K
// D of the block's rows comes first, from the dO tile and the forward's output, and is
// also written for the dK/dV kernel: a kernel of its own, it read dO a second time.
// The Q and dO fragments are read from shared memory for every key tile rather than
// held, which keeps the three 32x64 fp32 tiles in registers without spilling.
template <class T>
__global__ void __launch_bounds__(kThreads) flash_backward_query_kernel(
    FlashBackwardParams<T> p) {
  constexpr int kM = kQueryMTiles;
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);
  T* dout_tile = q_tile + kQueryBlockElems;
  T* k_tiles = dout_tile + kQueryBlockElems;
  T* v_tiles = k_tiles + 2 * kTileElems;
  float* block_dsum = reinterpret_cast<float*>(v_tiles + 2 * kTileElems);  // [kQueryBlockRows]
  const auto [b, h, q0, warp_row0, warp_last_query, ld, q_base, kv_tiles] = query_block_of(p);
  const int bh = blockIdx.x;
  const KeyValueStream<T> kv{k_tiles, v_tiles, q_base + p.channels, q_base + 2 * p.channels,
                             p.seq,   ld,      kv_tiles};

  load_tile_async<kQueryBlockRows>(q_tile, q_base, q0, p.seq, ld);
  load_tile_async<kQueryBlockRows>(
      dout_tile, p.dout + size_t(b) * p.seq * p.channels + size_t(h) * kHeadSize, q0, p.seq,
      size_t(p.channels));
  copy_async_commit();
  kv.load(0);
  // D, one row per thread, once the Q and dO tiles are in (the first K/V tile may still
  // be on its way).
  static_assert(kQueryBlockRows == kThreads, "one row of D per thread");
  copy_async_wait<1>();
  __syncthreads();
  {
    const int row = q0 + threadIdx.x;
    float total = 0.0f;
    if (row < p.seq) {
      const T* out_row = p.out + (size_t(b) * p.seq + row) * p.channels + size_t(h) * kHeadSize;
      const T* dout_row = dout_tile + threadIdx.x * kSmemStride;
#pragma unroll
      for (int c = 0; c < kHeadSize; c += Pack<T>::kCount) {
        const Pack<T> dy = load_pack(dout_row + c), y = load_pack(out_row + c);
#pragma unroll
        for (int i = 0; i < Pack<T>::kCount; ++i) total = fmaf(dy.get(i), y.get(i), total);
      }
      p.dsum[size_t(bh) * p.seq + row] = total;
    }
    block_dsum[threadIdx.x] = total;
  }
  __syncthreads();
  // The rows' lse (in the log2 domain) and D. Rows past seq get 0: whatever they compute
  // stays in their own rows of the products, which are never stored.
  float row_lse2[kM][2], row_dsum[kM][2];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int block_row = warp_row0 + m * 16 + accumulator_row(2 * r), row = q0 + block_row;
      row_lse2[m][r] = row < p.seq ? p.lse[size_t(bh) * p.seq + row] * kLog2e : 0.0f;
      row_dsum[m][r] = block_dsum[block_row];
    }
  }

  Accumulators<kM> dq = {};
  for (int j = 0; j < kv_tiles; ++j) {
    kv.acquire(j);
    // Causal: a tile wholly after the warp's last query adds nothing to its rows.
    if (!p.causal || j * kTileRows <= warp_last_query) {
      Fragments<kM> frag;
      load_a_fragments<kM>(frag, q_tile, warp_row0);
      Accumulators<kM> s = {};
      mma_a_tile_transposed<kM>(s, frag, kv.keys(j));
      for_each_element(s, [&](float& x, int m, int r) {
        x = fmaf(x, p.score_scale_log2, -row_lse2[m][r]);
      });
      if (key_tile_masked(j, q0 + warp_row0, p.seq, p.causal))
        mask_scores<false>(s, q0 + warp_row0, j * kTileRows, p.seq, p.causal);
      for_each_element(s, [](float& x, int, int) { x = exp2_flush_to_zero(x); });
      load_a_fragments<kM>(frag, dout_tile, warp_row0);
      Accumulators<kM> dp = {};
      mma_a_tile_transposed<kM>(dp, frag, kv.values(j));
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            dp[m][nt][e] = s[m][nt][e] * (dp[m][nt][e] - row_dsum[m][e / 2]);
        }
      }
      accumulators_to_a_fragments<T>(frag, dp);
      mma_a_tile<kM>(dq, frag, kv.keys(j));
    }
    // The next iteration's copies overwrite the buffers read here.
    __syncthreads();
  }

  // The loop ended with a barrier, so the Q and dO tiles are free for the fp32 staging.
  float* dq_stage = reinterpret_cast<float*>(q_tile);
  stage_accumulators<kM>(dq_stage, dq, p.score_scale);
  __syncthreads();
  write_staged_tile<kQueryBlockRows>(p.dqkv + size_t(b) * p.seq * ld + size_t(h) * kHeadSize, ld,
                                     dq_stage, q0, p.seq, p.accumulate);
}

// ---- launchers --------------------------------------------------------------------------

// The limits of the launch geometry: batch*heads blocks in x, 64-row tiles (or 128-query
// blocks) in y.
bool shape_fits(const AttentionShape& shape) {
  return shape.batch > 0 && shape.seq > 0 && shape.heads > 0 && shape.channels > 0 &&
         shape.channels % shape.heads == 0 && shape.channels / shape.heads == kHeadSize &&
         static_cast<long long>(shape.batch) * shape.heads * shape.seq < (1ll << 31) &&
         3ll * shape.channels < (1ll << 31) && ceil_div(shape.seq, kTileRows) <= 65535;
}

void check_shape(const AttentionShape& shape) {
  check_positive(shape.batch, "flash attention batch");
  check_positive(shape.seq, "flash attention seq");
  check_positive(shape.heads, "flash attention heads");
  SCALESTUDY_CHECK(shape_fits(shape),
                   "flash attention takes head size " + std::to_string(kHeadSize) +
                       " and at most 2^31 batch*heads*seq rows; got channels " +
                       std::to_string(shape.channels) + ", heads " +
                       std::to_string(shape.heads) + ", seq " + std::to_string(shape.seq));
}

void check_aligned(const void* ptr, const char* what) {
  check_not_null(ptr, what);
  SCALESTUDY_CHECK(aligned16(ptr), std::string(what) + " must be 16-byte aligned");
}

dim3 tile_grid(const AttentionShape& shape, int rows_per_block) {
  return dim3(static_cast<unsigned>(shape.batch * shape.heads),
              static_cast<unsigned>(ceil_div(shape.seq, rows_per_block)));
}

float score_scale_of() { return 1.0f / std::sqrt(static_cast<float>(kHeadSize)); }

template <class Params>
void launch_tiles(void (*kernel)(Params), int rows_per_block, size_t smem_bytes,
                  cudaStream_t stream, const AttentionShape& shape, const Params& params) {
  // Above 48 KB of dynamic shared memory a kernel has to opt in.
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem_bytes)));
  kernel<<<tile_grid(shape, rows_per_block), kThreads, smem_bytes, stream>>>(params);
  CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_supported(const AttentionShape& shape) { return shape_fits(shape); }

template <class T>
void launch_flash_attention_forward(cudaStream_t stream, T* out, float* lse, const T* qkv,
                                    const AttentionShape& shape) {
  check_shape(shape);
  check_aligned(out, "flash attention out");
  check_aligned(qkv, "flash attention qkv");
  check_not_null(lse, "flash attention lse");
  const FlashForwardParams<T> p{out, lse, qkv, shape.seq, shape.channels, shape.heads,
                                shape.causal, score_scale_of() * kLog2e};
  launch_tiles(flash_forward_kernel<T>, kQueryBlockRows, kForwardSmemBytes, stream, shape, p);
}

size_t flash_attention_backward_scratch_elems(const AttentionShape& shape) {
  return size_t(shape.batch) * shape.heads * shape.seq;
}

template <class T>
void launch_flash_attention_backward(cudaStream_t stream, const AttentionBackwardArgs<T, float>& args,
                                     Scratch scratch) {
  const auto& [dqkv, dout, qkv, out, lse, shape, dqkv_write] = args;
  const bool accumulate_dqkv = dqkv_write == GradientWrite::accumulate;
  check_shape(shape);
  check_aligned(dqkv, "flash attention dqkv");
  check_aligned(dout, "flash attention dout");
  check_aligned(qkv, "flash attention qkv");
  check_aligned(out, "flash attention out");
  check_not_null(lse, "flash attention lse");
  check_not_null(scratch.data, "flash attention scratch");
  SCALESTUDY_CHECK(scratch.elems >= flash_attention_backward_scratch_elems(shape),
                   "flash attention backward: scratch too small");
  const float scale = score_scale_of();
  const FlashBackwardParams<T> p{dqkv, dout, qkv, out, lse, scratch.data, shape.seq, shape.channels,
                                 shape.heads, shape.causal, scale, scale * kLog2e,
                                 accumulate_dqkv};
  // The two kernels write disjoint parts of dqkv (Q columns, K and V columns), each element
  // once; the dK/dV kernel reads the D that the dQ kernel writes, so it runs second.
  launch_tiles(flash_backward_query_kernel<T>, kQueryBlockRows, kQuerySmemBytes, stream, shape,
               p);
  launch_tiles(flash_backward_key_value_kernel<T>, kTileRows, kKeyValueSmemBytes, stream, shape,
               p);
}

#define SCALESTUDY_FLASH_ATTENTION_INSTANCES(T)                                                   \
  template void launch_flash_attention_forward(cudaStream_t, T*, float*, const T*,                \
                                               const AttentionShape&);                            \
  template void launch_flash_attention_backward(cudaStream_t, const AttentionBackwardArgs<T, float>&, \
                                                Scratch);
SCALESTUDY_FOR_EACH_16BIT_STORAGE(SCALESTUDY_FLASH_ATTENTION_INSTANCES)
#undef SCALESTUDY_FLASH_ATTENTION_INSTANCES

}  // namespace scalestudy::cuda
