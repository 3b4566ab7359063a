#include "sm90/gelu_gemm.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda_check.h"
#include "gelu_math.cuh"
#include "sm90/hopper.cuh"

namespace scalestudy::cuda::sm90 {
namespace {

// A CTA's tile is 128 x 256, computed by two consumer warpgroups together, each its
// 64-row half with one m64n256k16 wgmma per 16-deep slice (128 fp32 accumulators a
// thread). L2 delivers 12 bytes of operands per output at a depth of 768
// (2 * 768 * (1/256 + 1/128)). Each CTA loads its own operands: in 2-CTA clusters that
// multicast B, each stage's release waited for both CTAs, and the main loop ran at two
// thirds of this one's rate.
//
// The epilogue runs on warps of its own. Once a tile's MMAs are done, the consumers round
// their accumulators to 16 bits (with the bias added, in the forward: the values that the
// unfused path's GEMM stores) into a staging tile in shared memory, and go on to the next
// tile. Three epilogue warps then compute the GELU or its derivative there, in place, and
// store the results with TMA, beside the next tile's MMAs. The GELU's arithmetic is bounded
// by the multi-function unit (two of its instructions a value); run by the consumers after
// the MMAs, it left the tensor cores idle for a third of the time. No step of the epilogue
// waits on memory: the forward's pre leaves before its GELU overwrites it, and the input
// gradient's pre arrives in half chunks, each loaded while the warps work on the one
// before, from L2, where the tile before put it.
constexpr int kTileRows = 128, kTileColumns = 256, kTileDepth = 64;
constexpr int kConsumers = 2, kConsumerRows = kTileRows / kConsumers;
// One wgmma's depth.
constexpr int kSliceDepth = 16;
// 3 stages of 48 KB beside the epilogue's 64 KB staging tile and the input gradient's two
// 8 KB side buffers: the producer fills the next tile's first stages while the consumers
// write the staging tile.
constexpr int kStages = 3;
constexpr int kWarpgroupThreads = 128, kWarpThreads = 32;
constexpr int kConsumerThreads = kConsumers * kWarpgroupThreads;
constexpr int kThreads = kWarpgroupThreads + kConsumerThreads;
// The first warpgroup: warp 0 loads the operands (one thread), warps 1-3 run the epilogue.
// A fourth warpgroup for the epilogue does not fit: the launch's 512 threads would leave
// ptxas 128 registers a thread, fewer than an m64n256 wgmma's accumulators and operands.
constexpr int kEpilogueThreads = kWarpgroupThreads - kWarpThreads;
constexpr uint32_t kElemBytes = 2;
constexpr uint32_t kTileABytes = kTileRows * kTileDepth * kElemBytes;
constexpr uint32_t kTileBBytes = kTileColumns * kTileDepth * kElemBytes;
constexpr uint32_t kStageBytes = kTileABytes + kTileBBytes;
constexpr uint32_t kBarrierBytes = sizeof(uint64_t);
// A thread's accumulators: 64 x 256 over a warpgroup's 128 threads.
constexpr int kAccumulators = kConsumerRows * kTileColumns / kWarpgroupThreads;
// The staging tile is four chunks of 64 columns (128 bytes a row, TMA's widest swizzled
// box), each chunk [128 rows, 128 bytes] in TMA's 128-byte swizzled layout.
constexpr int kChunkColumns = 64;
constexpr int kChunks = kTileColumns / kChunkColumns;
constexpr int kChunkPairs = kChunkColumns / 8;  // a consumer thread's column pairs in a chunk
constexpr uint32_t kChunkBytes = kTileRows * kChunkColumns * kElemBytes;
constexpr uint32_t kRowBytes = kChunkColumns * kElemBytes;
constexpr uint32_t kUnitBytes = 16;  // what an epilogue thread reads and writes at once
constexpr int kChunkUnits = kChunkBytes / kUnitBytes;
constexpr int kRowUnits = kRowBytes / kUnitBytes;
// The input gradient's pre comes in half chunks, [64 rows, 128 bytes], into two side
// buffers.
constexpr int kHalfRows = kTileRows / 2;
constexpr uint32_t kHalfBytes = kChunkBytes / 2;
constexpr int kHalfUnits = kChunkUnits / 2;
constexpr int kHalves = 2 * kChunks;
constexpr int kSideBuffers = 2;
// The forward's bias for a tile comes with the tile's first slice, into one of two
// buffers: the producer runs at most kStages slices ahead of the consumers, which is less
// than a tile's slices (takes() asks for a depth of kStages slices or more).
constexpr int kBiasBuffers = 2;
constexpr uint32_t kBiasBytes = kTileColumns * kElemBytes;
// Per stage a full and an empty barrier; the staging tile's full and free; each side
// buffer's ready.
constexpr int kBarriers = 2 * kStages + 2 + kSideBuffers;
// A stage is free again, and the staging tile full, once every warp of both consumers has
// arrived.
constexpr uint32_t kConsumerWarps = kConsumerThreads / kWarpThreads;
// The epilogue warps' named barrier (0 is __syncthreads').
constexpr uint32_t kEpilogueBarrier = 1;
// The swizzled tiles must start 1024-byte aligned; the dynamic allocation is not.
constexpr uint32_t kSharedAlignment = 1024;
constexpr size_t kSharedBytes = kStages * kStageBytes + kChunks * kChunkBytes +
                                kSideBuffers * kHalfBytes +
                                kBiasBuffers * kBiasBytes + kBarriers * kBarrierBytes +
                                kSharedAlignment;
// The operand and epilogue warps need few registers; the consumers' 128 accumulators many.
// Both counts are multiples of 8 and fit the register file: 128 * 56 + 256 * 224 <= 65536.
constexpr uint32_t kEpilogueRegisters = 56, kConsumerRegisters = 224;
constexpr uintptr_t kOperandAlignment = 16;

// What the epilogue needs, and the grid of 128 x 256 tiles.
struct TileGrid {
  const __nv_bfloat16* bias;
  bool stores_pre;  // forward: pre is written
  int tile_columns;
  int tiles;
  int depth_blocks;
};

struct RingSlot {
  uint32_t stage;
  uint32_t parity;
};

// The ring is filled and drained in one order, counted in slices from the CTA's first
// tile: position p is stage p % kStages in its (p / kStages)-th round.
__device__ __forceinline__ RingSlot slot_of(int position) {
  return {static_cast<uint32_t>(position % kStages),
          static_cast<uint32_t>((position / kStages) & 1)};
}

struct SharedLayout {
  uint32_t a_tiles, b_tiles, staging, sides, bias, full, empty, staged, staging_free, ready;
  // Chunk c of the staging tile.
  __device__ uint32_t chunk(int c) const { return staging + c * kChunkBytes; }
  // The input gradient's side buffer b and the barrier its pre loads complete on.
  __device__ uint32_t side(int b) const { return sides + b * kHalfBytes; }
  __device__ uint32_t pre_ready(int b) const { return ready + b * kBarrierBytes; }
  __device__ uint32_t bias_buffer(int local_tile) const {
    return bias + (local_tile % kBiasBuffers) * kBiasBytes;
  }
  __device__ uint32_t a(uint32_t stage) const { return a_tiles + stage * kTileABytes; }
  __device__ uint32_t b(uint32_t stage) const { return b_tiles + stage * kTileBBytes; }
  __device__ uint32_t full_barrier(uint32_t stage) const { return full + stage * kBarrierBytes; }
  __device__ uint32_t empty_barrier(uint32_t stage) const {
    return empty + stage * kBarrierBytes;
  }
};

// Where a tile lies. Tiles go along the columns first, so the CTAs in flight share a few
// rows of A, and all of B stays in L2.
struct TileOrigin {
  int row0, column0;
};

__device__ __forceinline__ TileOrigin tile_origin(int tile, const TileGrid& grid) {
  return {(tile / grid.tile_columns) * kTileRows, (tile % grid.tile_columns) * kTileColumns};
}

// One thread loads every slice of the CTA's tiles, a stage at a time as both consumers
// free it, and with each tile's first slice, the forward's bias for the tile.
template <GeluEpilogue kEpilogue>
__device__ void produce(const CUtensorMap* a_map, const CUtensorMap* b_map,
                        const SharedLayout& shared, const TileGrid& grid) {
  int position = 0, local_tile = 0;
  for (int tile = blockIdx.x; tile < grid.tiles; tile += gridDim.x, ++local_tile) {
    const TileOrigin origin = tile_origin(tile, grid);
    for (int depth_block = 0; depth_block < grid.depth_blocks; ++depth_block, ++position) {
      const RingSlot slot = slot_of(position);
      // The first round's stages are free: the phase before the first has "completed".
      barrier_wait(shared.empty_barrier(slot.stage), slot.parity ^ 1);
      const uint32_t full = shared.full_barrier(slot.stage);
      const bool with_bias = kEpilogue == GeluEpilogue::forward && depth_block == 0;
      barrier_arrive_expect_bytes(full, kStageBytes + (with_bias ? kBiasBytes : 0));
      const int depth0 = depth_block * kTileDepth;
      tma_load_2d(shared.a(slot.stage), a_map, depth0, origin.row0, full);
      tma_load_2d(shared.b(slot.stage), b_map, depth0, origin.column0, full);
      if (with_bias)
        bulk_load(shared.bias_buffer(local_tile), grid.bias + origin.column0, kBiasBytes, full);
    }
  }
}

// The tensor maps of the epilogue's outputs and of the pre it reads.
struct EpilogueMaps {
  const CUtensorMap* out;
  const CUtensorMap* pre;
};

__device__ __forceinline__ uint32_t packed_pair(float first, float second) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ float2 unpacked_pair(uint32_t pair) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
}

__device__ __forceinline__ void store_shared(uint32_t address, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(address), "r"(value) : "memory");
}

__device__ __forceinline__ uint32_t load_shared(uint32_t address) {
  uint32_t value = 0;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(value) : "r"(address) : "memory");
  return value;
}

__device__ __forceinline__ uint4 load_shared_unit(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

__device__ __forceinline__ void store_shared_unit(uint32_t address, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// ---- the consumers ----------------------------------------------------------------------

// Where a consumer thread's values lie in the tile (wgmma's fragment: in warp w of consumer
// c, lane l holds rows 64c + 16w + l/4 and 8 below it, columns 8j + 2(l%4) and the one
// after, in accumulators 4j + 2 * lower and the next), and its byte in a chunk, in TMA's
// 128-byte swizzled layout: the 8 rows that a warp writes at once fall in 8 different
// bank groups.
struct FragmentPlace {
  int row;              // the upper of the thread's two rows
  uint32_t pair_bytes;  // its column pair's bytes within a 16-byte unit
  __device__ uint32_t at(int lower, int pair) const {
    const int r = row + 8 * lower;
    return r * kRowBytes + ((pair ^ (r & 7)) << 4) + pair_bytes;
  }
};

// The tile's accumulators into the staging tile as 16-bit pairs: the forward's
// acc + bias (pre, rounded as it is stored), the input gradient's product (rounded as the
// unfused GEMM stores it).
template <GeluEpilogue kEpilogue>
__device__ __forceinline__ void stage_tile(const float (&acc)[kAccumulators],
                                           const SharedLayout& shared, FragmentPlace place,
                                           uint32_t bias_buffer) {
#pragma unroll
  for (int j = 0; j < kAccumulators / 4; ++j) {
    float2 bias = {0.0f, 0.0f};
    if constexpr (kEpilogue == GeluEpilogue::forward)
      bias = unpacked_pair(load_shared(bias_buffer + 16 * j + place.pair_bytes));
    const uint32_t chunk = shared.chunk(j / kChunkPairs);
#pragma unroll
    for (int lower = 0; lower < 2; ++lower)
      store_shared(chunk + place.at(lower, j % kChunkPairs),
                   packed_pair(acc[4 * j + 2 * lower] + bias.x,
                               acc[4 * j + 2 * lower + 1] + bias.y));
  }
}

// The two consumer warpgroups take every tile of the CTA together: the MMAs of its slices
// as they arrive (freeing each stage once the MMAs that read it are done), then the tile
// into the staging tile once the epilogue warps have left it.
template <GeluEpilogue kEpilogue>
__device__ void consume(const SharedLayout& shared, const TileGrid& grid, int consumer) {
  const bool warp_leader = threadIdx.x % kWarpThreads == 0;
  const int warp = (threadIdx.x / kWarpThreads) % (kWarpgroupThreads / kWarpThreads);
  const int lane = threadIdx.x % kWarpThreads;
  const FragmentPlace place{consumer * kConsumerRows + warp * 16 + lane / 4, 4u * (lane % 4)};
  float acc[kAccumulators];
  int position = 0, local_tile = 0;
  for (int tile = blockIdx.x; tile < grid.tiles; tile += gridDim.x, ++local_tile) {
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;
    uint32_t previous_stage = 0;
    for (int depth_block = 0; depth_block < grid.depth_blocks; ++depth_block, ++position) {
      const RingSlot slot = slot_of(position);
      barrier_wait(shared.full_barrier(slot.stage), slot.parity);
      const uint32_t a = shared.a(slot.stage) + consumer * kConsumerRows * kRowBytes;
      const uint32_t b = shared.b(slot.stage);
      wgmma_fence();
#pragma unroll
      for (int slice = 0; slice < kTileDepth / kSliceDepth; ++slice) {
        const uint32_t offset = slice * kSliceDepth * kElemBytes;
        wgmma_m64n256k16_bf16(acc, swizzled_tile_descriptor(a + offset),
                              swizzled_tile_descriptor(b + offset));
      }
      wgmma_commit();
      if (depth_block > 0) {
        wgmma_wait<1>();
        if (warp_leader) barrier_arrive(shared.empty_barrier(previous_stage));
      }
      previous_stage = slot.stage;
    }
    wgmma_wait<0>();
    if (warp_leader) barrier_arrive(shared.empty_barrier(previous_stage));
    // The staging tile is free once the epilogue of the tile before has left it.
    barrier_wait(shared.staging_free, (local_tile & 1) ^ 1);
    stage_tile<kEpilogue>(acc, shared, place, shared.bias_buffer(local_tile));
    // The forward's pre goes out by TMA straight from the staging tile.
    fence_shared_for_tma();
    __syncwarp();
    if (warp_leader) barrier_arrive(shared.staged);
  }
}

// ---- the epilogue warps -----------------------------------------------------------------

// A 16-byte unit of a chunk (or of a half chunk): its row, and its byte in the swizzled
// layout. A half chunk's 64 rows start 8 KB into the chunk, a multiple of the swizzle's
// 8-row period, so the same bytes serve both.
__device__ __forceinline__ uint32_t unit_at(int unit) {
  const int row = unit / kRowUnits, column_unit = unit % kRowUnits;
  return row * kRowBytes + ((column_unit ^ (row & 7)) << 4);
}

__device__ __forceinline__ uint32_t gelu_of_pairs(uint32_t pre) {
  const float2 x = unpacked_pair(pre);
  return packed_pair(gelu_fast(x.x), gelu_fast(x.y));
}

__device__ __forceinline__ uint32_t gelu_backward_of_pairs(uint32_t pre, uint32_t product) {
  const float2 x = unpacked_pair(pre), d = unpacked_pair(product);
  return packed_pair(gelu_backward_fast(x.x, d.x), gelu_backward_fast(x.y, d.y));
}

// The forward's epilogue of a staged tile. pre leaves first, straight from the staging
// tile, one bulk group a chunk; then each chunk's GELU overwrites it in place once its
// store has read it, and goes out in a group of its own. At chunk c, the groups after
// pre's c-th are pre's 3 - c later ones and out's c earlier ones: 3 in all.
__device__ __forceinline__ void finish_forward(const SharedLayout& shared, const TileGrid& grid,
                                               const EpilogueMaps& maps, TileOrigin origin,
                                               int thread, bool issuer) {
  if (issuer && grid.stores_pre) {
    for (int c = 0; c < kChunks; ++c) {
      tma_store_2d(maps.pre, shared.chunk(c), origin.column0 + c * kChunkColumns, origin.row0);
      bulk_commit();
    }
  }
  for (int c = 0; c < kChunks; ++c) {
    if (issuer && grid.stores_pre) bulk_wait_read<kChunks - 1>();
    named_barrier_sync(kEpilogueBarrier, kEpilogueThreads);
    for (int unit = thread; unit < kChunkUnits; unit += kEpilogueThreads) {
      const uint32_t at = shared.chunk(c) + unit_at(unit);
      const uint4 pre = load_shared_unit(at);
      store_shared_unit(at, {gelu_of_pairs(pre.x), gelu_of_pairs(pre.y), gelu_of_pairs(pre.z),
                             gelu_of_pairs(pre.w)});
    }
    fence_shared_for_tma();
    named_barrier_sync(kEpilogueBarrier, kEpilogueThreads);
    if (issuer) {
      tma_store_2d(maps.out, shared.chunk(c), origin.column0 + c * kChunkColumns, origin.row0);
      bulk_commit();
    }
  }
}

// The input gradient reads pre in half chunks (64 rows of a chunk), through two side
// buffers in turn: while the warps work on one half, the next loads into the other. Half h
// of a tile is chunk h / 2, and goes to side buffer h % 2; kHalves is even, so every tile's
// half h takes the same buffer.
__device__ __forceinline__ void load_pre_half(const SharedLayout& shared, const EpilogueMaps& maps,
                                              TileOrigin origin, int half) {
  const int buffer = half % kSideBuffers;
  barrier_arrive_expect_bytes(shared.pre_ready(buffer), kHalfBytes);
  tma_load_2d(shared.side(buffer), maps.pre, origin.column0 + (half / 2) * kChunkColumns,
              origin.row0 + (half % 2) * kHalfRows, shared.pre_ready(buffer));
}

// The next tile's pre into L2, so that its halves' loads do not wait on memory.
__device__ __forceinline__ void prefetch_pre(const EpilogueMaps& maps, TileOrigin origin) {
  for (int half = 0; half < kHalves; ++half)
    tma_prefetch_2d(maps.pre, origin.column0 + (half / 2) * kChunkColumns,
                    origin.row0 + (half % 2) * kHalfRows);
}

// The input gradient's epilogue of a staged tile: out = gelu'(pre) * product, half chunk by
// half chunk, in place over the staged product; each chunk goes out once both its halves
// are done. `local_tile` counts the CTA's tiles, which sets the side buffers' parities.
__device__ __forceinline__ void finish_input_gradient(const SharedLayout& shared,
                                                      const TileGrid& grid,
                                                      const EpilogueMaps& maps, int tile,
                                                      int local_tile, int thread, bool issuer) {
  const TileOrigin origin = tile_origin(tile, grid);
  const int next_tile = tile + static_cast<int>(gridDim.x);
  const bool has_next = next_tile < grid.tiles;
  const TileOrigin next_origin = tile_origin(has_next ? next_tile : tile, grid);
  if (issuer && has_next) prefetch_pre(maps, next_origin);
  for (int half = 0; half < kHalves; ++half) {
    const int buffer = half % kSideBuffers;
    const int load = local_tile * kHalves + half;  // this buffer's (load / 2)-th
    barrier_wait(shared.pre_ready(buffer), (load / kSideBuffers) & 1);
    const uint32_t product_half = shared.chunk(half / 2) + (half % 2) * kHalfBytes;
    for (int unit = thread; unit < kHalfUnits; unit += kEpilogueThreads) {
      const uint32_t at = unit_at(unit);
      const uint4 pre = load_shared_unit(shared.side(buffer) + at);
      const uint4 product = load_shared_unit(product_half + at);
      store_shared_unit(product_half + at, {gelu_backward_of_pairs(pre.x, product.x),
                                            gelu_backward_of_pairs(pre.y, product.y),
                                            gelu_backward_of_pairs(pre.z, product.z),
                                            gelu_backward_of_pairs(pre.w, product.w)});
    }
    fence_shared_for_tma();
    named_barrier_sync(kEpilogueBarrier, kEpilogueThreads);
    if (!issuer) continue;
    if (half % 2 == 1) {
      const int c = half / 2;
      tma_store_2d(maps.out, shared.chunk(c), origin.column0 + c * kChunkColumns, origin.row0);
      bulk_commit();
    }
    // Every warp has read this buffer: the half after next goes into it.
    if (half + kSideBuffers < kHalves)
      load_pre_half(shared, maps, origin, half + kSideBuffers);
    else if (has_next)
      load_pre_half(shared, maps, next_origin, half + kSideBuffers - kHalves);
  }
}

// The epilogue warps take every tile the consumers stage, then free the staging tile once
// their stores have read it. `thread` numbers them from 0.
template <GeluEpilogue kEpilogue>
__device__ void finish_tiles(const SharedLayout& shared, const TileGrid& grid,
                             const EpilogueMaps& maps, int thread) {
  const bool issuer = thread == 0;
  if (kEpilogue == GeluEpilogue::input_gradient && issuer && blockIdx.x < grid.tiles) {
    for (int half = 0; half < kSideBuffers; ++half)
      load_pre_half(shared, maps, tile_origin(blockIdx.x, grid), half);
  }
  int local_tile = 0;
  for (int tile = blockIdx.x; tile < grid.tiles; tile += gridDim.x, ++local_tile) {
    barrier_wait(shared.staged, local_tile & 1);
    if constexpr (kEpilogue == GeluEpilogue::forward)
      finish_forward(shared, grid, maps, tile_origin(tile, grid), thread, issuer);
    else
      finish_input_gradient(shared, grid, maps, tile, local_tile, thread, issuer);
    if (issuer) {
      bulk_wait_read<0>();
      barrier_arrive(shared.staging_free);
    }
  }
  // The stores must be done before the CTA's shared memory goes.
  if (issuer) bulk_wait_all();
}

template <GeluEpilogue kEpilogue>
__global__ void __launch_bounds__(kThreads, 1)
    gelu_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                     const __grid_constant__ CUtensorMap b_map,
                     const __grid_constant__ CUtensorMap out_map,
                     const __grid_constant__ CUtensorMap pre_map, const TileGrid grid) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t shared_bytes[];
  const uint32_t base =
      (shared_address(shared_bytes) + kSharedAlignment - 1) & ~(kSharedAlignment - 1);
  SharedLayout shared;
  shared.a_tiles = base;
  shared.b_tiles = base + kStages * kTileABytes;
  shared.staging = shared.b_tiles + kStages * kTileBBytes;
  shared.sides = shared.staging + kChunks * kChunkBytes;
  shared.bias = shared.sides + kSideBuffers * kHalfBytes;
  shared.full = shared.bias + kBiasBuffers * kBiasBytes;
  shared.empty = shared.full + kStages * kBarrierBytes;
  shared.staged = shared.empty + kStages * kBarrierBytes;
  shared.staging_free = shared.staged + kBarrierBytes;
  shared.ready = shared.staging_free + kBarrierBytes;
  if (threadIdx.x == 0) {
    for (uint32_t stage = 0; stage < kStages; ++stage) {
      barrier_init(shared.full_barrier(stage), 1);
      barrier_init(shared.empty_barrier(stage), kConsumerWarps);
    }
    barrier_init(shared.staged, kConsumerWarps);
    barrier_init(shared.staging_free, 1);
    for (int b = 0; b < kSideBuffers; ++b) barrier_init(shared.pre_ready(b), 1);
    fence_barrier_init();
  }
  __syncthreads();
  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  const EpilogueMaps maps{&out_map, &pre_map};
  if (warpgroup == 0) {
    release_registers<kEpilogueRegisters>();
    if (threadIdx.x == 0) produce<kEpilogue>(&a_map, &b_map, shared, grid);
    if (threadIdx.x >= kWarpThreads)
      finish_tiles<kEpilogue>(shared, grid, maps, threadIdx.x - kWarpThreads);
  } else {
    claim_registers<kConsumerRegisters>();
    consume<kEpilogue>(shared, grid, warpgroup - 1);
  }
#endif
}

// [rows, columns] -> [columns, rows] through 32 x 32 tiles in shared memory.
constexpr int kTransposeTile = 32, kTransposeRowsPerPass = 8;

__global__ void transpose_kernel(__nv_bfloat16* out, const __nv_bfloat16* in, int rows,
                                 int columns) {
  __shared__ __nv_bfloat16 tile[kTransposeTile][kTransposeTile + 1];
  const int column = blockIdx.x * kTransposeTile + threadIdx.x;
  for (int r = threadIdx.y; r < kTransposeTile; r += kTransposeRowsPerPass) {
    const int row = blockIdx.y * kTransposeTile + r;
    if (row < rows && column < columns) tile[r][threadIdx.x] = in[size_t(row) * columns + column];
  }
  __syncthreads();
  const int out_column = blockIdx.y * kTransposeTile + threadIdx.x;
  for (int r = threadIdx.y; r < kTransposeTile; r += kTransposeRowsPerPass) {
    const int out_row = blockIdx.x * kTransposeTile + r;
    if (out_row < columns && out_column < rows)
      out[size_t(out_row) * rows + out_column] = tile[threadIdx.x][r];
  }
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                cudaEnableDefault, &found));
    SCALESTUDY_CHECK(found == cudaDriverEntryPointSuccess && function != nullptr,
                     "the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

// The TMA map of a row-major [rows, depth] bf16 matrix, in boxes of box_rows x kTileDepth
// (64 columns, 128 bytes) swizzled as the wgmma descriptors and the epilogue expect.
CUtensorMap tile_map(const void* matrix, int rows, int depth, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(depth), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_stride_bytes[1] = {static_cast<cuuint64_t>(depth) * kElemBytes};
  const cuuint32_t box[2] = {kTileDepth, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(matrix), dims,
      row_stride_bytes, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SCALESTUDY_CHECK(result == CUDA_SUCCESS,
                   "cuTensorMapEncodeTiled returned " + std::to_string(result));
  return map;
}

bool aligned(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % kOperandAlignment == 0;
}

template <GeluEpilogue kEpilogue>
void allow_shared_bytes() {
  CHECK_CUDA(cudaFuncSetAttribute(gelu_gemm_kernel<kEpilogue>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kSharedBytes)));
}

// The CTAs that fit on the device at once: one a multiprocessor, for the shared memory.
int resident_ctas_per_multiprocessor() {
  int ctas = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &ctas, gelu_gemm_kernel<GeluEpilogue::forward>, kThreads, kSharedBytes));
  return ctas;
}

}  // namespace

GeluGemm::GeluGemm() {
  int device = 0, major = 0, minor = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&device_multiprocessors_, cudaDevAttrMultiProcessorCount,
                                    device));
  device_is_hopper_ = major == 9 && minor == 0;
  if (device_is_hopper_) {
    allow_shared_bytes<GeluEpilogue::forward>();
    allow_shared_bytes<GeluEpilogue::input_gradient>();
    resident_ctas_ = device_multiprocessors_ * resident_ctas_per_multiprocessor();
    device_is_hopper_ = resident_ctas_ > 0;
  }
}

GeluGemm::~GeluGemm() {
  if (transposed_ != nullptr) CHECK_CUDA(cudaFree(transposed_));
}

bool GeluGemm::takes(const GeluGemmCall& call) const {
  if (!device_is_hopper_ || call.rows <= 0 || call.columns <= 0 || call.depth <= 0) return false;
  if (call.rows % kTileRows != 0 || call.columns % kTileColumns != 0 ||
      call.depth % kTileDepth != 0 || call.depth < kStages * kTileDepth)
    return false;
  const bool forward = call.epilogue == GeluEpilogue::forward;
  if (!aligned(call.a) || !aligned(call.b) || !aligned(call.out) || !aligned(call.pre) ||
      (forward && !aligned(call.bias)))
    return false;
  return forward ? call.bias != nullptr : call.pre != nullptr;
}

void GeluGemm::run(cudaStream_t stream, const GeluGemmCall& call, int multiprocessors) {
  SCALESTUDY_CHECK(takes(call), "the Hopper GELU GEMM was given a call it does not take");
  const TileGrid grid{static_cast<const __nv_bfloat16*>(call.bias),
                      call.pre != nullptr,
                      call.columns / kTileColumns,
                      (call.rows / kTileRows) * (call.columns / kTileColumns),
                      call.depth / kTileDepth};
  const CUtensorMap a_map = tile_map(call.a, call.rows, call.depth, kTileRows);
  const CUtensorMap b_map = tile_map(call.b, call.columns, call.depth, kTileColumns);
  // Chunks of a 128-row tile, 64 columns wide, and the input gradient's pre in half
  // chunks; a null pre (a forward that keeps none) gets out's map, which the kernel then
  // does not use.
  const bool forward = call.epilogue == GeluEpilogue::forward;
  const CUtensorMap out_map = tile_map(call.out, call.rows, call.columns, kTileRows);
  const CUtensorMap pre_map = tile_map(call.pre != nullptr ? call.pre : call.out, call.rows,
                                       call.columns, forward ? kTileRows : kHalfRows);
  int ctas = resident_ctas_;
  if (multiprocessors > 0 && multiprocessors < ctas) ctas = multiprocessors;
  ctas = std::min(ctas, grid.tiles);
  if (forward)
    gelu_gemm_kernel<GeluEpilogue::forward>
        <<<ctas, kThreads, kSharedBytes, stream>>>(a_map, b_map, out_map, pre_map, grid);
  else
    gelu_gemm_kernel<GeluEpilogue::input_gradient>
        <<<ctas, kThreads, kSharedBytes, stream>>>(a_map, b_map, out_map, pre_map, grid);
  CHECK_CUDA(cudaGetLastError());
}

const void* GeluGemm::transposed(cudaStream_t stream, const void* weight, int rows,
                                 int columns) {
  const size_t elems = static_cast<size_t>(rows) * columns;
  if (elems > transposed_elems_) {
    if (transposed_ != nullptr) CHECK_CUDA(cudaFree(transposed_));
    CHECK_CUDA(cudaMalloc(&transposed_, elems * kElemBytes));
    transposed_elems_ = elems;
  }
  const dim3 blocks((columns + kTransposeTile - 1) / kTransposeTile,
                    (rows + kTransposeTile - 1) / kTransposeTile);
  transpose_kernel<<<blocks, dim3(kTransposeTile, kTransposeRowsPerPass), 0, stream>>>(
      static_cast<__nv_bfloat16*>(transposed_), static_cast<const __nv_bfloat16*>(weight), rows,
      columns);
  CHECK_CUDA(cudaGetLastError());
  return transposed_;
}

}  // namespace scalestudy::cuda::sm90
