#pragma once
// Device-side helpers shared by the kernel families. Included from .cu files only: the
// per-family .cuh headers that the host code sees declare plain C++ launchers.
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <string>

#include "cuda_check.h"

// Every launch is checked where it happens, so that a bad configuration is reported
// with the launcher's file:line instead of surfacing at some later synchronisation.
#define CHECK_LAUNCH() CHECK_CUDA(cudaGetLastError())

namespace scalestudy::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr unsigned kFullWarpMask = 0xffffffffu;

// Elementwise kernels use grid-stride loops with a capped grid: a few waves over the
// 132 multiprocessors of an H100 keep memory busy, and the cap keeps the grid size (and
// so any per-block partials) independent of the device.
inline constexpr int kElementwiseThreads = 256;
inline constexpr int kMaxElementwiseBlocks = 8192;

// A grid-stride loop's first index (this thread's place in the grid) and its stride (the
// grid's thread count), in size_t so that ranges of 2^32 elements and more are walked.
__device__ __forceinline__ size_t grid_thread_index() {
  return blockIdx.x * size_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ size_t grid_threads() { return size_t{gridDim.x} * blockDim.x; }

inline int elementwise_blocks(size_t elems) {
  const size_t wanted = (elems + kElementwiseThreads - 1) / kElementwiseThreads;
  const size_t capped = wanted < size_t{kMaxElementwiseBlocks} ? wanted : kMaxElementwiseBlocks;
  return capped > 0 ? static_cast<int>(capped) : 1;
}

inline void check_positive(long long value, const char* what) {
  SCALESTUDY_CHECK(value > 0, std::string(what) + " must be positive, got " +
                                  std::to_string(value));
}

inline void check_not_null(const void* ptr, const char* what) {
  SCALESTUDY_CHECK(ptr != nullptr, std::string(what) + " must not be null");
}

// An operand of a launch, named for the messages of the checks.
struct NamedOperand {
  const void* pointer;
  const char* name;
};

inline void check_not_null(std::initializer_list<NamedOperand> operands) {
  for (const NamedOperand& operand : operands) check_not_null(operand.pointer, operand.name);
}

// 2^x in one MUFU.EX2 instruction. exp2f is that instruction plus a test and two
// rescaling multiplies that keep results below 2^-126 as subnormals; here they flush to
// zero. Both are within 2 ulp above that. The callers exponentiate differences to a
// maximum (x <= 0), where a flushed term is under 1e-38 of the largest.
__device__ __forceinline__ float exp2_flush_to_zero(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

template <class Real>
__device__ inline Real warp_reduce_sum(Real value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(kFullWarpMask, value, offset);
  return value;
}

__device__ inline float warp_reduce_max(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(kFullWarpMask, value, offset));
  return value;
}

// Block-wide reductions for blocks of whole warps (at most 32 of them). The combination
// order is fixed by the thread layout, so a given launch shape always gives the same
// bits. Every thread receives the result. `shared` must hold kWarpSize values and may be
// reused right after the call returns.
// The warp reductions as block_reduce takes them.
struct WarpSum {
  template <class Real>
  __device__ Real operator()(Real value) const {
    return warp_reduce_sum(value);
  }
};
struct WarpMax {
  __device__ float operator()(float value) const { return warp_reduce_max(value); }
};

// The warps' results combine in shared memory: lane i of every warp reads warp i's, the
// lanes past the last warp `identity`, and one more warp reduction gives the block's.
template <class Real, class WarpReduce>
__device__ inline Real block_reduce(Real value, Real* shared, Real identity, WarpReduce reduce) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  value = reduce(value);
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  Real total = lane < warps ? shared[lane] : identity;
  total = reduce(total);
  // The second barrier lets the caller overwrite `shared` for its next reduction.
  __syncthreads();
  return total;
}

template <class Real>
__device__ inline Real block_reduce_sum(Real value, Real* shared) {
  return block_reduce(value, shared, Real(0), WarpSum{});
}

__device__ inline float block_reduce_max(float value, float* shared) {
  return block_reduce(value, shared, -INFINITY, WarpMax{});
}

// Asynchronous copies from global into shared memory (cp.async), for the kernels that
// stage their operands in shared memory: the fused attention's tiles and the fused
// cross-entropy's rows.
//
// With valid false nothing is read and the destination is zero-filled: rows past the
// sequence must hold zeros, not stale values, because a probability of 0 times a NaN left
// there would still be NaN. Both addresses must be aligned to the copy's size.
__device__ __forceinline__ void copy_async_16(void* smem, const void* global, bool valid = true) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_async_4(void* smem, const void* global, bool valid = true) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `pending` of this thread's committed groups are still in flight
// (groups complete in commit order); a __syncthreads must follow before other threads'
// copies are read.
template <int pending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

}  // namespace scalestudy::cuda
