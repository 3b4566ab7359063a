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

// A consumer's tile is 128 x 192 (two m64n192k16 per 16-deep slice): the widest whose 192
// fp32 accumulators a thread can hold (kConsumerRegisters). The two CTAs of a cluster take
// the two 128-row halves of a 256 x 192 block, so each slice of B serves both: each CTA
// loads half of it and multicasts that half to both. L2 then delivers 14 bytes of operands
// per output at GPT-2 small's depth of 768 (2 * 768 * (1/192 + 1/256)), against 24 for
// 128 x 128 tiles, whose kernel ran at L2's bandwidth.
constexpr int kTileRows = 128, kTileColumns = 192, kTileDepth = 64;
constexpr int kClusterCtas = 2;
constexpr int kBlockRows = kTileRows * kClusterCtas;
constexpr int kBHalfRows = kTileColumns / kClusterCtas;
// One wgmma's depth, and the rows of one wgmma's output (a tile has two such halves).
constexpr int kSliceDepth = 16, kHalfRows = 64;
// 4 stages of 40 KB, beside the epilogue's staging (what shared memory holds): a tile's 12
// slices at depth 768 pass through the ring in three rounds.
constexpr int kStages = 4;
constexpr int kWarpgroupThreads = 128, kWarpThreads = 32;
constexpr int kConsumers = 2;
constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
constexpr uint32_t kElemBytes = 2;
constexpr uint32_t kTileABytes = kTileRows * kTileDepth * kElemBytes;
constexpr uint32_t kTileBBytes = kTileColumns * kTileDepth * kElemBytes;
constexpr uint32_t kBHalfBytes = kTileBBytes / kClusterCtas;
constexpr uint32_t kStageBytes = kTileABytes + kTileBBytes;
constexpr uint32_t kBarrierBytes = sizeof(uint64_t);
// The epilogue goes through shared memory in chunks of 64 columns (128 bytes, TMA's widest
// swizzled box), each consumer with two chunk buffers: the forward's pre and out, or the
// input gradient's out and the pre it reads.
constexpr int kChunkColumns = 64;
constexpr int kChunks = kTileColumns / kChunkColumns;
constexpr int kChunkPairs = kChunkColumns / 8;  // a thread's column pairs in a chunk's row
constexpr uint32_t kChunkBytes = kTileRows * kChunkColumns * kElemBytes;
constexpr uint32_t kRowBytes = kChunkColumns * kElemBytes;
constexpr int kStagingBuffers = 2 * kConsumers;
// Per stage a full and an empty barrier; per consumer a turn and a pre-ready barrier.
constexpr int kBarriers = 2 * kStages + 2 * kConsumers;
// A stage is free again once every warp of the consumer that read it, in both CTAs (whose
// producers both write into it), has arrived.
constexpr uint32_t kStageReleases = kClusterCtas * kWarpgroupThreads / kWarpThreads;
constexpr uint16_t kWholeCluster = (1u << kClusterCtas) - 1;
// The swizzled tiles must start 1024-byte aligned; the dynamic allocation is not.
constexpr uint32_t kSharedAlignment = 1024;
constexpr size_t kSharedBytes = kStages * kStageBytes + kStagingBuffers * kChunkBytes +
                                kBarriers * kBarrierBytes + kSharedAlignment;
// The producer needs few registers; the consumers' 192 fp32 accumulators need many. Both
// counts are multiples of 8 and fill the register file: 128 * 40 + 256 * 232 <= 65536.
constexpr uint32_t kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr uintptr_t kOperandAlignment = 16;

// What the consumers' epilogue needs, and the grid of 256 x 192 blocks.
struct TileGrid {
  const __nv_bfloat16* bias;
  bool stores_pre;  // forward: pre is written
  int block_columns;
  int blocks;
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
  uint32_t a_tiles, b_tiles, staging, full, empty, turn, pre_ready;
  __device__ uint32_t chunk_buffer(int consumer, int buffer) const {
    return staging + (2 * consumer + buffer) * kChunkBytes;
  }
  __device__ uint32_t pre_ready_barrier(int consumer) const {
    return pre_ready + consumer * kBarrierBytes;
  }
  __device__ uint32_t a(uint32_t stage) const { return a_tiles + stage * kTileABytes; }
  __device__ uint32_t b(uint32_t stage) const { return b_tiles + stage * kTileBBytes; }
  __device__ uint32_t full_barrier(uint32_t stage) const { return full + stage * kBarrierBytes; }
  __device__ uint32_t empty_barrier(uint32_t stage) const {
    return empty + stage * kBarrierBytes;
  }
  __device__ uint32_t turn_barrier(int consumer) const { return turn + consumer * kBarrierBytes; }
};

// Where a CTA's tile of a block lies.
struct TileOrigin {
  int row0, column0;
};

__device__ __forceinline__ TileOrigin tile_origin(int block, uint32_t rank, const TileGrid& grid) {
  return {(block / grid.block_columns) * kBlockRows + static_cast<int>(rank) * kTileRows,
          (block % grid.block_columns) * kTileColumns};
}

// One thread loads every slice of the CTA's tiles: its own A, and its half of B for both
// CTAs of the cluster, a stage at a time as the consumers of both free it.
__device__ void produce(const CUtensorMap* a_map, const CUtensorMap* b_map,
                        const SharedLayout& shared, const TileGrid& grid, uint32_t rank) {
  const int cluster = blockIdx.x / kClusterCtas, clusters = gridDim.x / kClusterCtas;
  int position = 0;
  for (int block = cluster; block < grid.blocks; block += clusters) {
    const TileOrigin origin = tile_origin(block, rank, grid);
    for (int depth_block = 0; depth_block < grid.depth_blocks; ++depth_block, ++position) {
      const RingSlot slot = slot_of(position);
      // The first round's stages are free: the phase before the first has "completed".
      barrier_wait(shared.empty_barrier(slot.stage), slot.parity ^ 1);
      const uint32_t full = shared.full_barrier(slot.stage);
      barrier_arrive_expect_bytes(full, kStageBytes);
      const int depth0 = depth_block * kTileDepth;
      tma_load_2d(shared.a(slot.stage), a_map, depth0, origin.row0, full);
      tma_load_2d_multicast(shared.b(slot.stage) + rank * kBHalfBytes, b_map, depth0,
                            origin.column0 + static_cast<int>(rank) * kBHalfRows, full,
                            kWholeCluster);
    }
  }
}

// One warp's release of a stage, on the barrier of each CTA whose producer writes into it.
__device__ __forceinline__ void release_stage(const SharedLayout& shared, uint32_t stage) {
#pragma unroll
  for (uint32_t rank = 0; rank < kClusterCtas; ++rank)
    barrier_arrive_in_cta(shared.empty_barrier(stage), rank);
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

__device__ __forceinline__ void store_shared(uint32_t address, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(address), "r"(value) : "memory");
}

__device__ __forceinline__ float2 load_shared_pair(uint32_t address) {
  uint32_t value = 0;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(value) : "r"(address) : "memory");
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&value));
}

// The input gradient's pre, one chunk of the tile, into the consumer's second buffer.
__device__ __forceinline__ void load_pre_chunk(const SharedLayout& shared, int consumer,
                                               const EpilogueMaps& maps, TileOrigin origin,
                                               int chunk) {
  const uint32_t ready = shared.pre_ready_barrier(consumer);
  barrier_arrive_expect_bytes(ready, kChunkBytes);
  tma_load_2d(shared.chunk_buffer(consumer, 1), maps.pre, origin.column0 + chunk * kChunkColumns,
              origin.row0, ready);
}

// The tile's epilogue from the accumulators (hopper.cuh gives the fragment's layout: a
// thread's values lie in 4 rows, 2 halves of upper and lower, 48 columns in each), chunk by
// chunk through shared memory in TMA's 128-byte swizzled layout (so the 8 rows that a
// warp writes at once fall in 8 different bank groups), stored by TMA. One thread of the
// consumer issues the copies, and the consumer's named barrier orders the rest around them.
template <GeluEpilogue kEpilogue>
__device__ __forceinline__ void store_tile(const float (&acc)[2][96], TileOrigin origin,
                                           const TileGrid& grid, const SharedLayout& shared,
                                           int consumer, const EpilogueMaps& maps,
                                           uint32_t& pre_chunks_read) {
  const int thread = threadIdx.x % kWarpgroupThreads;
  const bool issuer = thread == 0;
  const uint32_t barrier_id = 1 + consumer;
  const int warp_row = (thread / kWarpThreads) * 16 + (thread % kWarpThreads) / 4;
  const uint32_t quad_bytes = 4 * (thread % 4);
  const uint32_t first = shared.chunk_buffer(consumer, 0);
  const uint32_t second = shared.chunk_buffer(consumer, 1);
#pragma unroll
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    // The buffers are free once the copies of the chunk before have read them.
    if (issuer) bulk_wait_read<0>();
    named_barrier_sync(barrier_id, kWarpgroupThreads);
    float2 bias[kChunkPairs];
    if constexpr (kEpilogue == GeluEpilogue::forward) {
#pragma unroll
      for (int j = 0; j < kChunkPairs; ++j)
        bias[j] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
            grid.bias + origin.column0 + chunk * kChunkColumns + 8 * j + 2 * (thread % 4)));
    } else {
      barrier_wait(shared.pre_ready_barrier(consumer), pre_chunks_read++ & 1);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int lower = 0; lower < 2; ++lower) {
        const int row = half * kHalfRows + warp_row + 8 * lower;
        const float* x = &acc[half][2 * lower + 4 * kChunkPairs * chunk];
#pragma unroll
        for (int j = 0; j < kChunkPairs; ++j) {
          const uint32_t at = row * kRowBytes + ((j ^ (row & 7)) << 4) + quad_bytes;
          if constexpr (kEpilogue == GeluEpilogue::forward) {
            const float pre0 = x[4 * j] + bias[j].x, pre1 = x[4 * j + 1] + bias[j].y;
            store_shared(first + at, packed_pair(pre0, pre1));
            store_shared(second + at, packed_pair(gelu_fast(pre0), gelu_fast(pre1)));
          } else {
            const float2 pre = load_shared_pair(second + at);
            store_shared(first + at, packed_pair(gelu_backward_fast(pre.x, x[4 * j]),
                                                 gelu_backward_fast(pre.y, x[4 * j + 1])));
          }
        }
      }
    }
    fence_shared_for_tma();
    named_barrier_sync(barrier_id, kWarpgroupThreads);
    if (issuer) {
      const int column = origin.column0 + chunk * kChunkColumns;
      if constexpr (kEpilogue == GeluEpilogue::forward) {
        if (grid.stores_pre) tma_store_2d(maps.pre, first, column, origin.row0);
        tma_store_2d(maps.out, second, column, origin.row0);
      } else {
        tma_store_2d(maps.out, first, column, origin.row0);
        if (chunk + 1 < kChunks) load_pre_chunk(shared, consumer, maps, origin, chunk + 1);
      }
      bulk_commit();
    }
  }
}

// A consumer warpgroup takes every kConsumers-th of the CTA's tiles: for each, the MMAs of
// its slices as they arrive (freeing each stage, in both CTAs, once the MMAs that read it
// are done), then the epilogue, while the other consumer runs its tile's MMAs.
//
// The consumers take turns at the ring: one starts a tile's MMAs only once the other has
// waited for every slice of the tile before (its turn barrier). Besides keeping the
// tensor cores to one tile at a time, the turns keep the parity waits sound: a consumer
// that waited for a stage while the stage's previous round was still unloaded would take
// the round before that, of the same parity, for its own.
template <GeluEpilogue kEpilogue>
__device__ void consume(const SharedLayout& shared, const TileGrid& grid, int consumer,
                        uint32_t rank, const EpilogueMaps& maps) {
  const int cluster = blockIdx.x / kClusterCtas, clusters = gridDim.x / kClusterCtas;
  const bool releases = threadIdx.x % kWarpThreads == 0;
  float acc[2][96];
  int local = consumer;
  uint32_t turns_waited = 0, pre_chunks_read = 0;
  for (int block = cluster + consumer * clusters; block < grid.blocks;
       block += kConsumers * clusters, local += kConsumers) {
    if (local > 0) barrier_wait(shared.turn_barrier(consumer), turns_waited++ & 1);
    const TileOrigin origin = tile_origin(block, rank, grid);
    // The input gradient's first chunk of pre arrives while the MMAs run.
    if constexpr (kEpilogue == GeluEpilogue::input_gradient) {
      if (threadIdx.x % kWarpgroupThreads == 0) load_pre_chunk(shared, consumer, maps, origin, 0);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int i = 0; i < 96; ++i) acc[half][i] = 0.0f;
    int position = local * grid.depth_blocks;
    uint32_t previous_stage = 0;
    for (int depth_block = 0; depth_block < grid.depth_blocks; ++depth_block, ++position) {
      const RingSlot slot = slot_of(position);
      barrier_wait(shared.full_barrier(slot.stage), slot.parity);
      const uint32_t a = shared.a(slot.stage), b = shared.b(slot.stage);
      wgmma_fence();
#pragma unroll
      for (int slice = 0; slice < kTileDepth / kSliceDepth; ++slice) {
        const uint32_t offset = slice * kSliceDepth * kElemBytes;
        const uint64_t b_descriptor = swizzled_tile_descriptor(b + offset);
        wgmma_m64n192k16_bf16(acc[0], swizzled_tile_descriptor(a + offset), b_descriptor);
        wgmma_m64n192k16_bf16(acc[1], swizzled_tile_descriptor(a + kTileABytes / 2 + offset),
                              b_descriptor);
      }
      wgmma_commit();
      if (depth_block > 0) {
        wgmma_wait<1>();
        if (releases) release_stage(shared, previous_stage);
      }
      previous_stage = slot.stage;
    }
    barrier_arrive(shared.turn_barrier((consumer + 1) % kConsumers));
    wgmma_wait<0>();
    if (releases) release_stage(shared, previous_stage);
    store_tile<kEpilogue>(acc, origin, grid, shared, consumer, maps, pre_chunks_read);
  }
  // The stores must be done before the CTA's shared memory goes.
  if (threadIdx.x % kWarpgroupThreads == 0) bulk_wait_all();
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
  shared.full = shared.staging + kStagingBuffers * kChunkBytes;
  shared.empty = shared.full + kStages * kBarrierBytes;
  shared.turn = shared.empty + kStages * kBarrierBytes;
  shared.pre_ready = shared.turn + kConsumers * kBarrierBytes;
  const uint32_t rank = cluster_cta_rank();
  if (threadIdx.x == 0) {
    for (uint32_t stage = 0; stage < kStages; ++stage) {
      barrier_init(shared.full_barrier(stage), 1);
      barrier_init(shared.empty_barrier(stage), kStageReleases);
    }
    for (int consumer = 0; consumer < kConsumers; ++consumer) {
      barrier_init(shared.turn_barrier(consumer), kWarpgroupThreads);
      barrier_init(shared.pre_ready_barrier(consumer), 1);
    }
    fence_barrier_init();
  }
  // The other CTA's producer and consumers use this CTA's barriers from the start.
  cluster_sync();
  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (warpgroup == 0) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) produce(&a_map, &b_map, shared, grid, rank);
  } else {
    claim_registers<kConsumerRegisters>();
    consume<kEpilogue>(shared, grid, warpgroup - 1, rank, EpilogueMaps{&out_map, &pre_map});
  }
  // Neither CTA leaves while the other may still write into its stages or arrive on its
  // barriers.
  cluster_sync();
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

// A launch of `ctas` CTAs in clusters of kClusterCtas; `attribute` must outlive it.
cudaLaunchConfig_t cluster_launch(int ctas, cudaStream_t stream, cudaLaunchAttribute& attribute) {
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kClusterCtas;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// The clusters that can run at once, one CTA a multiprocessor: fewer than half the
// multiprocessors where a GPC has an odd number of them.
int resident_clusters(int multiprocessors) {
  cudaLaunchAttribute attribute{};
  const cudaLaunchConfig_t config = cluster_launch(multiprocessors, nullptr, attribute);
  int clusters = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveClusters(&clusters, gelu_gemm_kernel<GeluEpilogue::forward>,
                                            &config));
  return clusters;
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
    resident_ctas_ = kClusterCtas * resident_clusters(device_multiprocessors_);
    device_is_hopper_ = resident_ctas_ > 0;
  }
}

GeluGemm::~GeluGemm() {
  if (transposed_ != nullptr) CHECK_CUDA(cudaFree(transposed_));
}

bool GeluGemm::takes(const GeluGemmCall& call) const {
  if (!device_is_hopper_ || call.rows <= 0 || call.columns <= 0 || call.depth <= 0) return false;
  if (call.rows % kBlockRows != 0 || call.columns % kTileColumns != 0 ||
      call.depth % kTileDepth != 0)
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
                      (call.rows / kBlockRows) * (call.columns / kTileColumns),
                      call.depth / kTileDepth};
  const CUtensorMap a_map = tile_map(call.a, call.rows, call.depth, kTileRows);
  const CUtensorMap b_map = tile_map(call.b, call.columns, call.depth, kBHalfRows);
  // Chunks of a 128-row tile, 64 columns wide; a null pre (a forward that keeps none) gets
  // out's map, which the kernel then does not use.
  const CUtensorMap out_map = tile_map(call.out, call.rows, call.columns, kTileRows);
  const CUtensorMap pre_map =
      tile_map(call.pre != nullptr ? call.pre : call.out, call.rows, call.columns, kTileRows);
  int ctas = resident_ctas_;
  if (multiprocessors > 0 && multiprocessors < ctas) ctas = multiprocessors;
  ctas = std::min(ctas / kClusterCtas, grid.blocks) * kClusterCtas;
  if (ctas < kClusterCtas) ctas = kClusterCtas;
  cudaLaunchAttribute attribute{};
  const cudaLaunchConfig_t config = cluster_launch(ctas, stream, attribute);
  if (call.epilogue == GeluEpilogue::forward)
    CHECK_CUDA(cudaLaunchKernelEx(&config, gelu_gemm_kernel<GeluEpilogue::forward>, a_map, b_map,
                                  out_map, pre_map, grid));
  else
    CHECK_CUDA(cudaLaunchKernelEx(&config, gelu_gemm_kernel<GeluEpilogue::input_gradient>, a_map,
                                  b_map, out_map, pre_map, grid));
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
