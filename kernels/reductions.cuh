#pragma once
// Deterministic reductions. Every reduction splits its input the same way for a given
// length (a fixed grid, fixed chunks, fixed combination trees) and never uses atomics,
// so the same inputs give the same bits on every run and on every Hopper part.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

// ---- whole-buffer sums, in double ----------------------------------------------------
// Each thread accumulates its grid-stride share in double, blocks reduce in double, and
// one final block adds the per-block partials in block order. scratch holds
// reduction_scratch_doubles() doubles; *device_result receives the total.
size_t reduction_scratch_doubles();
void launch_sum(cudaStream_t stream, double* device_result, const float* x, size_t elems,
                double* scratch, size_t scratch_doubles);
// The same over bf16 storage (each value widened exactly).
void launch_sum(cudaStream_t stream, double* device_result, const __nv_bfloat16* x, size_t elems,
                double* scratch, size_t scratch_doubles);
// The same over fp16 storage (each value widened exactly; an inf stays inf).
void launch_sum(cudaStream_t stream, double* device_result, const __half* x, size_t elems,
                double* scratch, size_t scratch_doubles);
void launch_sum_of_squares(cudaStream_t stream, double* device_result, const float* x,
                           size_t elems, double* scratch, size_t scratch_doubles);

// ---- column sums of a row-major [rows, columns] matrix ------------------------------
// Two stages: fp32 partial sums over chunks of kColumnChunkRows rows, written as a
// [column_partial_rows(rows), columns] matrix, then a double sum of the partials (split
// over chunks and combined in a fixed order) added into the destination.
inline constexpr int kColumnChunkRows = 64;
// The first stage's blocks are kColumnTile columns (a warp's lanes) by kColumnRowLanes
// rows, here and in the kernels that write such partials themselves.
inline constexpr int kColumnTile = 32;
inline constexpr int kColumnRowLanes = 8;
inline int column_partial_rows(int rows) {
  return (rows + kColumnChunkRows - 1) / kColumnChunkRows;
}
// dst[c] += sum_r x[r, c]. scratch holds at least column_partial_rows(rows)*columns floats.
void launch_column_sums(cudaStream_t stream, float* dst, const float* x, int rows, int columns,
                        float* scratch, size_t scratch_elems);
// The same over bf16 storage: fp32 partials and an fp32 dst, as above.
void launch_column_sums(cudaStream_t stream, float* dst, const __nv_bfloat16* x, int rows,
                        int columns, float* scratch, size_t scratch_elems);
// And over fp16 storage.
void launch_column_sums(cudaStream_t stream, float* dst, const __half* x, int rows, int columns,
                        float* scratch, size_t scratch_elems);
// dst[c] += sum_k partials[k, c], the second stage on its own, for kernels that write
// their partials in the layout above; and, given second_dst, the same for a second matrix
// of partials of the same shape in the same launch.
void launch_add_column_partials(cudaStream_t stream, float* dst, const float* partials,
                                int partial_rows, int columns, float* second_dst = nullptr,
                                const float* second_partials = nullptr);

}  // namespace scalestudy::cuda
