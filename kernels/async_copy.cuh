#pragma once
// Asynchronous copies from global into shared memory (cp.async), shared by the kernels
// that stage their operands in shared memory: the fused attention's tiles and the fused
// cross-entropy's rows. Included from .cu files only.
#include <cuda_runtime.h>

namespace scalestudy::cuda {

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
