#include "reductions.cuh"

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

constexpr int kSumThreads = 256;
// Fixed, not derived from the device, so that the partition (and the bits of the
// result) is the same on every GPU; 1024 blocks of 256 threads fill an H100 several times.
constexpr int kSumBlocks = 1024;
constexpr int kFinalSumThreads = 1024;

// Groups of kSumGroup consecutive elements, a thread taking groups g, g + threads, ... and
// adding each group's elements in order: the order, and so the bits, do not depend on
// whether the loads are 16-byte vectors (fp32 at an aligned address) or single elements.
// kSumBatch groups are loaded before any is added, so that a thread has that many loads in
// flight rather than one (a gradient norm over 124 M floats ran at 2.3 TB/s with one).
constexpr int kSumGroup = 4;
constexpr int kSumBatch = 4;

template <class T>
__device__ __forceinline__ void load_group(float (&values)[kSumGroup], const T* x, size_t group,
                                           bool vectors) {
  if constexpr (std::is_same_v<T, float>) {
    if (vectors) {
      const float4 four = reinterpret_cast<const float4*>(x)[group];
      values[0] = four.x, values[1] = four.y, values[2] = four.z, values[3] = four.w;
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kSumGroup; ++j) values[j] = to_float(x[group * kSumGroup + j]);
}

template <bool kSquares, class T>
__global__ void partial_sums_kernel(double* __restrict__ partials, const T* __restrict__ x,
                                    size_t elems) {
  __shared__ double shared[kWarpSize];
  const size_t threads = grid_threads();
  const size_t first = grid_thread_index();
  const size_t groups = elems / kSumGroup;
  const bool vectors = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  double total = 0.0;
  auto add = [&](float element) {
    const double value = element;
    total += kSquares ? value * value : value;
  };
  for (size_t batch = first; batch < groups; batch += kSumBatch * threads) {
    float values[kSumBatch][kSumGroup];
#pragma unroll
    for (int b = 0; b < kSumBatch; ++b) {
      const size_t group = batch + b * threads;
      if (group < groups) load_group(values[b], x, group, vectors);
    }
#pragma unroll
    for (int b = 0; b < kSumBatch; ++b) {
      if (batch + b * threads >= groups) break;
#pragma unroll
      for (int j = 0; j < kSumGroup; ++j) add(values[b][j]);
    }
  }
  // The elements after the last whole group, one a thread.
  if (groups * kSumGroup + first < elems) add(to_float(x[groups * kSumGroup + first]));
  total = block_reduce_sum(total, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void final_sum_kernel(double* __restrict__ result,
                                 const double* __restrict__ partials, int count) {
  __shared__ double shared[kWarpSize];
  double total = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) total += partials[i];
  total = block_reduce_sum(total, shared);
  if (threadIdx.x == 0) *result = total;
}

template <bool kSquares, class T>
void launch_sum_impl(cudaStream_t stream, double* device_result, const T* x, size_t elems,
                     double* scratch, size_t scratch_doubles) {
  check_not_null(device_result, "sum result");
  if (elems == 0) {
    CHECK_CUDA(cudaMemsetAsync(device_result, 0, sizeof(double), stream));
    return;
  }
  check_not_null(x, "sum input");
  check_not_null(scratch, "sum scratch");
  SCALESTUDY_CHECK(scratch_doubles >= reduction_scratch_doubles(), "sum: scratch too small");
  const size_t wanted = (elems + kSumThreads - 1) / kSumThreads;
  const int blocks = wanted < size_t{kSumBlocks} ? static_cast<int>(wanted) : kSumBlocks;
  partial_sums_kernel<kSquares, T><<<blocks, kSumThreads, 0, stream>>>(scratch, x, elems);
  CHECK_LAUNCH();
  final_sum_kernel<<<1, kFinalSumThreads, 0, stream>>>(device_result, scratch, blocks);
  CHECK_LAUNCH();
}

// Block (kColumnTile, kColumnRowLanes): a warp reads 32 consecutive columns of one row,
// so loads are coalesced; the row lanes are combined in lane order.
template <class T>
__global__ void column_partials_kernel(float* __restrict__ partials, const T* __restrict__ x,
                                       int rows, int columns) {
  __shared__ float tile[kColumnRowLanes][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int chunk = blockIdx.y;
  const int row_end = min(rows, (chunk + 1) * kColumnChunkRows);
  float total = 0.0f;
  if (c < columns) {
    for (int r = chunk * kColumnChunkRows + threadIdx.y; r < row_end; r += kColumnRowLanes)
      total += to_float(x[size_t(r) * columns + c]);
  }
  tile[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && c < columns) {
    float chunk_total = tile[0][threadIdx.x];
    for (int lane = 1; lane < kColumnRowLanes; ++lane) chunk_total += tile[lane][threadIdx.x];
    partials[size_t(chunk) * columns + c] = chunk_total;
  }
}

// The same partials where rows are whole 16-byte packs: each thread loads one pack of
// consecutive columns per row, so a warp moves 512 bytes a load instead of 64 (bf16) and
// a block covers 8 times (4 for fp32) as many columns. Every column is summed in the same
// order as above (row lane y takes rows y, y + 8, ...; lanes combined in lane order), so
// both kernels give the same bits and the pointer's alignment never changes a result.
template <class T>
__global__ void column_partials_packed_kernel(float* __restrict__ partials,
                                              const T* __restrict__ x, int rows, int columns) {
  constexpr int kCount = Pack<T>::kCount;
  constexpr int kTileColumns = kColumnTile * kCount;
  static_assert(kCount % 4 == 0, "the tile is written a float4 at a time");
  __shared__ __align__(16) float tile[kColumnRowLanes][kTileColumns];
  const int first_column = blockIdx.x * kTileColumns;
  const int c = first_column + threadIdx.x * kCount;  // columns % kCount == 0: whole packs
  const int chunk = blockIdx.y;
  const int row_begin = chunk * kColumnChunkRows;
  const int row_end = min(rows, row_begin + kColumnChunkRows);
  constexpr int kSteps = kColumnChunkRows / kColumnRowLanes;
  float total[kCount] = {};
  if (c < columns) {
    // All of a thread's loads are issued before the first add, to keep them in flight.
    Pack<T> packs[kSteps];
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int r = row_begin + step * kColumnRowLanes + threadIdx.y;
      if (r < row_end) packs[step] = load_pack(x + size_t(r) * columns + c);
    }
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      if (row_begin + step * kColumnRowLanes + int(threadIdx.y) < row_end) {
#pragma unroll
        for (int i = 0; i < kCount; ++i) total[i] += packs[step].get(i);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kCount; i += 4) {
    *reinterpret_cast<float4*>(&tile[threadIdx.y][threadIdx.x * kCount + i]) =
        make_float4(total[i], total[i + 1], total[i + 2], total[i + 3]);
  }
  __syncthreads();
  // One column a thread, so that the partials are written coalesced.
  for (int t = threadIdx.y * kColumnTile + threadIdx.x; t < kTileColumns;
       t += kColumnTile * kColumnRowLanes) {
    const int column = first_column + t;
    if (column < columns) {
      float chunk_total = tile[0][t];
      for (int lane = 1; lane < kColumnRowLanes; ++lane) chunk_total += tile[lane][t];
      partials[size_t(chunk) * columns + column] = chunk_total;
    }
  }
}

constexpr int kPartialRowLanes = 32;
// Partial rows a thread loads before it adds any: with 32 row lanes, the 1024 partial rows
// of a LayerNorm backward at 32768 rows are two rounds of loads a thread, where one load
// at a time made the kernel a chain of memory latencies (5 µs a call at 768 columns).
constexpr int kPartialLoads = 16;

// One matrix of partials and the sums it adds into.
struct ColumnPartials {
  float* dst;
  const float* partials;
};

// Block (kColumnTile, kPartialRowLanes): row lane j sums partial rows j, j + 32, ... of
// its column in double, in that order, which splits each column's serial chain of loads
// and adds (a few hundred columns would otherwise give a few blocks of long chains); the
// lanes are then combined in lane order. blockIdx.y picks the matrix: two of the same
// shape (a LayerNorm's weight and bias partials) take one launch.
__global__ void __launch_bounds__(kColumnTile * kPartialRowLanes)
    add_column_partials_kernel(ColumnPartials first_matrix, ColumnPartials second_matrix,
                               int partial_rows, int columns) {
  __shared__ double tile[kPartialRowLanes][kColumnTile];
  const ColumnPartials matrix = blockIdx.y == 0 ? first_matrix : second_matrix;
  float* __restrict__ dst = matrix.dst;
  const float* __restrict__ partials = matrix.partials;
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  double total = 0.0;
  if (c < columns) {
    for (int first = threadIdx.y; first < partial_rows;
         first += kPartialRowLanes * kPartialLoads) {
      float values[kPartialLoads];
#pragma unroll
      for (int j = 0; j < kPartialLoads; ++j) {
        const int k = first + j * kPartialRowLanes;
        values[j] = k < partial_rows ? partials[size_t(k) * columns + c] : 0.0f;
      }
      // Adding the zeros of rows past the end leaves a double sum unchanged.
#pragma unroll
      for (int j = 0; j < kPartialLoads; ++j) total += values[j];
    }
  }
  tile[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && c < columns) {
    double column_total = tile[0][threadIdx.x];
    for (int lane = 1; lane < kPartialRowLanes; ++lane) column_total += tile[lane][threadIdx.x];
    dst[c] += static_cast<float>(column_total);
  }
}

template <class T>
void column_sums(cudaStream_t stream, float* dst, const T* x, int rows, int columns,
                 float* scratch, size_t scratch_elems) {
  check_positive(rows, "column sums rows");
  check_positive(columns, "column sums columns");
  check_not_null(dst, "column sums dst");
  check_not_null(x, "column sums input");
  check_not_null(scratch, "column sums scratch");
  const int partial_rows = column_partial_rows(rows);
  SCALESTUDY_CHECK(partial_rows <= 65535, "column sums: too many rows for the grid");
  SCALESTUDY_CHECK(scratch_elems >= size_t(partial_rows) * columns,
                   "column sums: scratch too small");
  const dim3 block(kColumnTile, kColumnRowLanes);
  const size_t column_packs =
      pack_count<T>(size_t(columns), columns % Pack<T>::kCount == 0 && aligned16(x));
  if (column_packs > 0) {
    const dim3 grid(static_cast<unsigned>((column_packs + kColumnTile - 1) / kColumnTile),
                    partial_rows);
    column_partials_packed_kernel<T><<<grid, block, 0, stream>>>(scratch, x, rows, columns);
  } else {
    const dim3 grid((columns + kColumnTile - 1) / kColumnTile, partial_rows);
    column_partials_kernel<T><<<grid, block, 0, stream>>>(scratch, x, rows, columns);
  }
  CHECK_LAUNCH();
  launch_add_column_partials(stream, dst, scratch, partial_rows, columns);
}

}  // namespace

size_t reduction_scratch_doubles() { return kSumBlocks; }

void launch_sum(cudaStream_t stream, double* device_result, const float* x, size_t elems,
                double* scratch, size_t scratch_doubles) {
  launch_sum_impl<false>(stream, device_result, x, elems, scratch, scratch_doubles);
}

void launch_sum(cudaStream_t stream, double* device_result, const bf16* x, size_t elems,
                double* scratch, size_t scratch_doubles) {
  launch_sum_impl<false>(stream, device_result, x, elems, scratch, scratch_doubles);
}

void launch_sum(cudaStream_t stream, double* device_result, const fp16* x, size_t elems,
                double* scratch, size_t scratch_doubles) {
  launch_sum_impl<false>(stream, device_result, x, elems, scratch, scratch_doubles);
}

void launch_sum_of_squares(cudaStream_t stream, double* device_result, const float* x,
                           size_t elems, double* scratch, size_t scratch_doubles) {
  launch_sum_impl<true>(stream, device_result, x, elems, scratch, scratch_doubles);
}

void launch_column_sums(cudaStream_t stream, float* dst, const float* x, int rows, int columns,
                        float* scratch, size_t scratch_elems) {
  column_sums(stream, dst, x, rows, columns, scratch, scratch_elems);
}

void launch_column_sums(cudaStream_t stream, float* dst, const bf16* x, int rows, int columns,
                        float* scratch, size_t scratch_elems) {
  column_sums(stream, dst, x, rows, columns, scratch, scratch_elems);
}

void launch_column_sums(cudaStream_t stream, float* dst, const fp16* x, int rows, int columns,
                        float* scratch, size_t scratch_elems) {
  column_sums(stream, dst, x, rows, columns, scratch, scratch_elems);
}

void launch_add_column_partials(cudaStream_t stream, float* dst, const float* partials,
                                int partial_rows, int columns, float* second_dst,
                                const float* second_partials) {
  check_positive(partial_rows, "column partials rows");
  check_positive(columns, "column partials columns");
  check_not_null(dst, "column partials dst");
  check_not_null(partials, "column partials");
  const bool second = second_dst != nullptr;
  if (second) check_not_null(second_partials, "second column partials");
  const dim3 grid((columns + kColumnTile - 1) / kColumnTile, second ? 2 : 1);
  const dim3 block(kColumnTile, kPartialRowLanes);
  const ColumnPartials first_matrix{dst, partials};
  add_column_partials_kernel<<<grid, block, 0, stream>>>(
      first_matrix, second ? ColumnPartials{second_dst, second_partials} : first_matrix,
      partial_rows, columns);
  CHECK_LAUNCH();
}

}  // namespace scalestudy::cuda
