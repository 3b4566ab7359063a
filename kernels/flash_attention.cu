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

constexpr size_t kForwardSmemBytes = 5 * kTileElems * 2;  // Q, and K and V twice

// One block per (64-query tile, batch*head). The key/value tiles stream through a double
// buffer (the next one is copied while this one is used). Per query row the running max
// m and sum l of exp2(score - m) rescale the output accumulator whenever m grows; only
// the tiles a row can see are visited, so causal blocks stop at their diagonal.
template <class T>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(FlashForwardParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);
  T* k_tiles = q_tile + kTileElems;
  T* v_tiles = k_tiles + 2 * kTileElems;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  // The last query tiles see the most keys: launch them first.
  const int q_tile_index = gridDim.y - 1 - blockIdx.y;
  const int q0 = q_tile_index * kTileRows;
  const size_t ld = 3 * size_t(p.channels);
  const T* q_base = p.qkv + size_t(b) * p.seq * ld + size_t(h) * kHeadSize;
  const T* k_base = q_base + p.channels;
  const T* v_base = q_base + 2 * p.channels;
  const int kv_tiles = p.causal ? q_tile_index + 1 : ceil_div(p.seq, kTileRows);
  // Only the last tile visited can hold masked keys: the causal diagonal, or the keys
  // past the end of the sequence.
  const bool last_tile_masked = p.causal || p.seq % kTileRows != 0;

  load_tile_async(q_tile, q_base, q0, p.seq, ld);
  copy_async_commit();
  load_tile_async(k_tiles, k_base, 0, p.seq, ld);
  load_tile_async(v_tiles, v_base, 0, p.seq, ld);
  copy_async_commit();
  copy_async_wait<1>();
  __syncthreads();
  uint32_t q_frag[kKSteps][4];
  load_a_fragments(q_frag, q_tile, warp * 16);

  float o[kNTiles][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY};  // in the log2 domain
  float row_sum[2] = {0.0f, 0.0f};            // this lane's part; the quad's is summed last
  for (int j = 0; j < kv_tiles; ++j) {
    // KeyValueStream::acquire written out: with nvcc 13.0 the struct form made this
    // kernel ~20% slower (different register allocation), the dQ kernel no slower.
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
    const T* k_tile = k_tiles + (j % 2) * kTileElems;
    const T* v_tile = v_tiles + (j % 2) * kTileElems;

    float s[kNTiles][4] = {};
    mma_a_tile_transposed(s, q_frag, k_tile);
    const bool masked = last_tile_masked && j == kv_tiles - 1;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= p.score_scale_log2;
        if (masked && !visible(q0 + warp * 16 + accumulator_row(e),
                               j * kTileRows + accumulator_column(nt, e), p.seq, p.causal))
          s[nt][e] = -INFINITY;
      }
    }
    float rescale[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = row_max[r];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
        tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      tile_max = quad_max(tile_max);
      // A row with nothing visible yet keeps max -inf; exponentiating against 0 instead
      // gives exact zeros rather than NaN from -inf - -inf.
      base[r] = tile_max == -INFINITY ? 0.0f : tile_max;
      rescale[r] = exp2f(row_max[r] - base[r]);
      row_max[r] = tile_max;
      row_sum[r] *= rescale[r];
    }
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - base[e / 2]);
        row_sum[e / 2] += s[nt][e];
        o[nt][e] *= rescale[e / 2];
      }
    }
    uint32_t p_frag[kKSteps][4];
    accumulators_to_a_fragments<T>(p_frag, s);
    mma_a_tile(o, p_frag, v_tile);
    // The next iteration's copies overwrite the buffer read here.
    __syncthreads();
  }

  // Stage the warp's 16 output rows in its own rows of the Q tile (only this warp ever
  // read them) so that the global stores are whole 16-byte row pieces.
  float inverse_sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(row_sum[r]);
    inverse_sum[r] = total > 0.0f ? 1.0f / total : 0.0f;
    const int row = q0 + warp * 16 + accumulator_row(2 * r);
    if (lane % 4 == 0 && row < p.seq)
      p.lse[size_t(bh) * p.seq + row] = (row_max[r] + log2f(total)) * kLn2;
  }
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<uint32_t*>(q_tile + (warp * 16 + accumulator_row(2 * r)) * kSmemStride +
                                   accumulator_column(nt, 0)) =
          pack_pair<T>(o[nt][2 * r] * inverse_sum[r], o[nt][2 * r + 1] * inverse_sum[r]);
    }
  }
  __syncwarp();
  constexpr int kChunksPerRow = kHeadSize / 8;
#pragma unroll
  for (int i = 0; i < 16 * kChunksPerRow / kWarpSize; ++i) {
    const int chunk = lane + i * kWarpSize;
    const int r = warp * 16 + chunk / kChunksPerRow, c = chunk % kChunksPerRow;
    const int row = q0 + r;
    if (row < p.seq) {
      T* dst = p.out + (size_t(b) * p.seq + row) * p.channels + size_t(h) * kHeadSize + c * 8;
      *reinterpret_cast<int4*>(dst) =
          *reinterpret_cast<const int4*>(q_tile + r * kSmemStride + c * 8);
    }
  }
}

// ---- backward ---------------------------------------------------------------------------
// Three kernels: D = rowsum(dout * out); dK and dV per key tile; dQ per query tile. Each
// gradient element is then owned by one thread and summed in a fixed order (no atomics,
// so the result is bit-reproducible), at the price of computing S and dP in both of the
// last two kernels.

template <class T>
struct FlashBackwardParams {
  T* dqkv;
  const T* dout;
  const T* qkv;
  const T* out;
  const float* lse;
  float* dsum;  // D = rowsum(dout * out), [B*NH, seq], in the scratch
  int seq;
  int channels;
  int heads;
  bool causal;
  float score_scale;       // 1/sqrt(HS)
  float score_scale_log2;  // log2(e)/sqrt(HS)
  bool accumulate;         // dqkv += the gradients; otherwise dqkv = them, unread
};

constexpr int kDsumThreads = 256;

// D[b,h,t] = sum_d dout * out, the softmax backward's per-row term, which equals
// sum_t2 P dP. One thread per (b, t, h), h fastest so that a warp reads whole rows.
template <class T>
__global__ void flash_backward_dsum_kernel(FlashBackwardParams<T> p, long long rows) {
  const long long index = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (index >= rows) return;
  const int h = static_cast<int>(index % p.heads);
  const long long token = index / p.heads;  // b*seq + t
  const size_t offset = size_t(token) * p.channels + size_t(h) * kHeadSize;
  float total = 0.0f;
#pragma unroll
  for (int c = 0; c < kHeadSize; c += Pack<T>::kCount) {
    const Pack<T> dy = load_pack(p.dout + offset + c), y = load_pack(p.out + offset + c);
#pragma unroll
    for (int i = 0; i < Pack<T>::kCount; ++i) total = fmaf(dy.get(i), y.get(i), total);
  }
  const long long b = token / p.seq, t = token % p.seq;
  p.dsum[(b * p.heads + h) * p.seq + t] = total;
}

// dst[rows of 64 x HS] += the fp32 staging tile, read, summed in fp32 and rounded once,
// or, without accumulate, dst = the tile rounded once; rows past seq are skipped. dst
// points at row 0, column 0 of the head in dqkv.
template <class T>
__device__ __forceinline__ void write_staged_tile(T* dst, size_t ld, const float* stage, int row0,
                                                  int seq, bool accumulate) {
  constexpr int kChunksPerRow = kHeadSize / Pack<T>::kCount;
#pragma unroll 2
  for (int chunk = threadIdx.x; chunk < kTileRows * kChunksPerRow; chunk += kThreads) {
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

// Writes a warp's accumulator tile [16 x 64] (scaled) into rows warp*16.. of the staging.
__device__ __forceinline__ void stage_accumulators(float* stage, const float (&acc)[kNTiles][4],
                                                   float scale) {
  const int warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<float2*>(stage + (warp * 16 + accumulator_row(2 * r)) * kStageStride +
                                 accumulator_column(nt, 0)) =
          make_float2(acc[nt][2 * r] * scale, acc[nt][2 * r + 1] * scale);
    }
  }
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
  uint32_t k_frag[kKSteps][4], v_frag[kKSteps][4];
  load_a_fragments(k_frag, k_tile, warp * 16);
  load_a_fragments(v_frag, v_tile, warp * 16);

  float dk[kNTiles][4] = {}, dv[kNTiles][4] = {};
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

    float s[kNTiles][4] = {};
    mma_a_tile_transposed(s, k_frag, q_tile);
    if (masked) mask_scores<true>(s, k0 + warp * 16, i * kTileRows, p.seq, p.causal);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const float2 lse = *reinterpret_cast<const float2*>(lse_tile + accumulator_column(nt, 0));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float query_lse = e % 2 == 0 ? lse.x : lse.y;
        s[nt][e] = exp2f(fmaf(s[nt][e], p.score_scale_log2, -query_lse * kLog2e));
      }
    }
    uint32_t frag[kKSteps][4];
    accumulators_to_a_fragments<T>(frag, s);
    mma_a_tile(dv, frag, dout_tile);

    float dp[kNTiles][4] = {};
    mma_a_tile_transposed(dp, v_frag, dout_tile);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const float2 dsum = *reinterpret_cast<const float2*>(dsum_tile + accumulator_column(nt, 0));
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dp[nt][e] = s[nt][e] * (dp[nt][e] - (e % 2 == 0 ? dsum.x : dsum.y));
    }
    accumulators_to_a_fragments<T>(frag, dp);
    mma_a_tile(dk, frag, q_tile);
    // The next iteration's copies overwrite the buffers read here.
    __syncthreads();
  }

  // The loop ended with a barrier, so the Q and dO buffers are free for the fp32 staging.
  float* dk_stage = reinterpret_cast<float*>(q_tiles);
  float* dv_stage = dk_stage + kTileRows * kStageStride;
  stage_accumulators(dk_stage, dk, p.score_scale);
  stage_accumulators(dv_stage, dv, 1.0f);
  __syncthreads();
  T* dkey = p.dqkv + size_t(b) * p.seq * ld + p.channels + size_t(h) * kHeadSize;
  write_staged_tile(dkey, ld, dk_stage, k0, p.seq, p.accumulate);
  write_staged_tile(dkey + p.channels, ld, dv_stage, k0, p.seq, p.accumulate);
}

constexpr size_t kQuerySmemBytes = 6 * kTileElems * 2;

// dQ of one 64-query tile: one block per (query tile, batch*head), looping over the key
// tiles it sees with K and V double buffered, as the forward does:
//   P = exp2(Q K^T * scale*log2e - lse*log2e);  dP = dO V^T;  dS = P (dP - D);  dQ += dS K
template <class T>
__global__ void __launch_bounds__(kThreads) flash_backward_query_kernel(
    FlashBackwardParams<T> p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);
  T* dout_tile = q_tile + kTileElems;
  T* k_tiles = dout_tile + kTileElems;
  T* v_tiles = k_tiles + 2 * kTileElems;
  const int warp = threadIdx.x / kWarpSize;
  const int bh = blockIdx.x, b = bh / p.heads, h = bh % p.heads;
  const int q_tile_index = gridDim.y - 1 - blockIdx.y;
  const int q0 = q_tile_index * kTileRows;
  const size_t ld = 3 * size_t(p.channels);
  const T* q_base = p.qkv + size_t(b) * p.seq * ld + size_t(h) * kHeadSize;
  const int kv_tiles = p.causal ? q_tile_index + 1 : ceil_div(p.seq, kTileRows);
  const KeyValueStream<T> kv{k_tiles, v_tiles, q_base + p.channels, q_base + 2 * p.channels,
                             p.seq,   ld,      kv_tiles};
  const bool last_tile_masked = p.causal || p.seq % kTileRows != 0;

  load_tile_async(q_tile, q_base, q0, p.seq, ld);
  load_tile_async(dout_tile, p.dout + size_t(b) * p.seq * p.channels + size_t(h) * kHeadSize, q0,
                  p.seq, size_t(p.channels));
  copy_async_commit();
  kv.load(0);
  // The rows' lse (in the log2 domain) and D. Rows past seq get 0: whatever they compute
  // stays in their own rows of the products, which are never stored.
  float row_lse2[2], row_dsum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + accumulator_row(2 * r);
    row_lse2[r] = row < p.seq ? p.lse[size_t(bh) * p.seq + row] * kLog2e : 0.0f;
    row_dsum[r] = row < p.seq ? p.dsum[size_t(bh) * p.seq + row] : 0.0f;
  }
  copy_async_wait<1>();
  __syncthreads();
  uint32_t q_frag[kKSteps][4], dout_frag[kKSteps][4];
  load_a_fragments(q_frag, q_tile, warp * 16);
  load_a_fragments(dout_frag, dout_tile, warp * 16);

  float dq[kNTiles][4] = {};
  for (int j = 0; j < kv_tiles; ++j) {
    kv.acquire(j);
    float s[kNTiles][4] = {};
    mma_a_tile_transposed(s, q_frag, kv.keys(j));
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[nt][e] = fmaf(s[nt][e], p.score_scale_log2, -row_lse2[e / 2]);
    }
    if (last_tile_masked && j == kv_tiles - 1)
      mask_scores<false>(s, q0 + warp * 16, j * kTileRows, p.seq, p.causal);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = exp2f(s[nt][e]);
    }
    float dp[kNTiles][4] = {};
    mma_a_tile_transposed(dp, dout_frag, kv.values(j));
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nt][e] = s[nt][e] * (dp[nt][e] - row_dsum[e / 2]);
    }
    uint32_t ds_frag[kKSteps][4];
    accumulators_to_a_fragments<T>(ds_frag, dp);
    mma_a_tile(dq, ds_frag, kv.keys(j));
    // The next iteration's copies overwrite the buffers read here.
    __syncthreads();
  }

  // The loop ended with a barrier, so the Q and dO tiles are free for the fp32 staging.
  float* dq_stage = reinterpret_cast<float*>(q_tile);
  stage_accumulators(dq_stage, dq, p.score_scale);
  __syncthreads();
  write_staged_tile(p.dqkv + size_t(b) * p.seq * ld + size_t(h) * kHeadSize, ld, dq_stage, q0,
                    p.seq, p.accumulate);
}

// ---- launchers --------------------------------------------------------------------------

// The limits of the launch geometry: batch*heads blocks in x, 64-row tiles in y.
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

dim3 tile_grid(const AttentionShape& shape) {
  return dim3(static_cast<unsigned>(shape.batch * shape.heads),
              static_cast<unsigned>(ceil_div(shape.seq, kTileRows)));
}

float score_scale_of() { return 1.0f / std::sqrt(static_cast<float>(kHeadSize)); }

template <class Params>
void launch_tiles(void (*kernel)(Params), size_t smem_bytes, cudaStream_t stream,
                  const AttentionShape& shape, const Params& params) {
  // Above 48 KB of dynamic shared memory a kernel has to opt in.
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem_bytes)));
  kernel<<<tile_grid(shape), kThreads, smem_bytes, stream>>>(params);
  CHECK_LAUNCH();
}

template <class T>
void flash_forward(cudaStream_t stream, T* out, float* lse, const T* qkv,
                   const AttentionShape& shape) {
  check_shape(shape);
  check_aligned(out, "flash attention out");
  check_aligned(qkv, "flash attention qkv");
  check_not_null(lse, "flash attention lse");
  const FlashForwardParams<T> p{out, lse, qkv, shape.seq, shape.channels, shape.heads,
                                shape.causal, score_scale_of() * kLog2e};
  launch_tiles(flash_forward_kernel<T>, kForwardSmemBytes, stream, shape, p);
}

size_t dsum_elems_of(const AttentionShape& shape) {
  return size_t(shape.batch) * shape.heads * shape.seq;
}

template <class T>
void flash_backward(cudaStream_t stream, T* dqkv, const T* dout, const T* qkv, const T* out,
                    const float* lse, const AttentionShape& shape, float* scratch,
                    size_t scratch_elems, bool accumulate_dqkv) {
  check_shape(shape);
  check_aligned(dqkv, "flash attention dqkv");
  check_aligned(dout, "flash attention dout");
  check_aligned(qkv, "flash attention qkv");
  check_aligned(out, "flash attention out");
  check_not_null(lse, "flash attention lse");
  check_not_null(scratch, "flash attention scratch");
  SCALESTUDY_CHECK(scratch_elems >= dsum_elems_of(shape),
                   "flash attention backward: scratch too small");
  const float scale = score_scale_of();
  const FlashBackwardParams<T> p{dqkv, dout, qkv, out, lse, scratch, shape.seq, shape.channels,
                                 shape.heads, shape.causal, scale, scale * kLog2e,
                                 accumulate_dqkv};
  const auto rows = static_cast<long long>(dsum_elems_of(shape));
  flash_backward_dsum_kernel<T><<<static_cast<unsigned>((rows + kDsumThreads - 1) / kDsumThreads),
                                  kDsumThreads, 0, stream>>>(p, rows);
  CHECK_LAUNCH();
  // The two kernels write disjoint parts of dqkv (K and V columns, Q columns), each
  // element once, so the order between them does not matter for the result.
  launch_tiles(flash_backward_key_value_kernel<T>, kKeyValueSmemBytes, stream, shape, p);
  launch_tiles(flash_backward_query_kernel<T>, kQuerySmemBytes, stream, shape, p);
}

}  // namespace

bool flash_attention_supported(const AttentionShape& shape) { return shape_fits(shape); }

void launch_flash_attention_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* qkv,
                                    const AttentionShape& shape) {
  flash_forward(stream, out, lse, qkv, shape);
}

void launch_flash_attention_forward(cudaStream_t stream, fp16* out, float* lse, const fp16* qkv,
                                    const AttentionShape& shape) {
  flash_forward(stream, out, lse, qkv, shape);
}

size_t flash_attention_backward_scratch_elems(const AttentionShape& shape) {
  return dsum_elems_of(shape);
}

void launch_flash_attention_backward(cudaStream_t stream, bf16* dqkv, const bf16* dout,
                                     const bf16* qkv, const bf16* out, const float* lse,
                                     const AttentionShape& shape, float* scratch,
                                     size_t scratch_elems, bool accumulate_dqkv) {
  flash_backward(stream, dqkv, dout, qkv, out, lse, shape, scratch, scratch_elems,
                 accumulate_dqkv);
}

void launch_flash_attention_backward(cudaStream_t stream, fp16* dqkv, const fp16* dout,
                                     const fp16* qkv, const fp16* out, const float* lse,
                                     const AttentionShape& shape, float* scratch,
                                     size_t scratch_elems, bool accumulate_dqkv) {
  flash_backward(stream, dqkv, dout, qkv, out, lse, shape, scratch, scratch_elems,
                 accumulate_dqkv);
}

}  // namespace scalestudy::cuda
