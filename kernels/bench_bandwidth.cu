// The copy kernel of `scalestudy bench bandwidth`: as little as possible between the
// loads and the stores, so that its rate is the memory system's. 16-byte accesses halve
// the instructions per byte against scalar ones, and a grid-stride loop over a capped
// grid keeps every multiprocessor streaming whatever the size.
#include "bench_bandwidth.cuh"
#include "common.cuh"

namespace scalestudy::cuda {
namespace {

__global__ void bench_copy_kernel(float4* __restrict__ dst, const float4* __restrict__ src, size_t vectors,
                                  float* __restrict__ dst_tail, const float* __restrict__ src_tail,
                                  size_t tail_elems) {
  const size_t stride = grid_threads();
  const size_t first = grid_thread_index();
  for (size_t i = first; i < vectors; i += stride) dst[i] = src[i];
  if (first < tail_elems) dst_tail[first] = src_tail[first];
}

}  // namespace

void launch_bench_copy(cudaStream_t stream, float* dst, const float* src, size_t elems) {
  if (elems == 0) return;
  check_not_null(dst, "bench copy dst");
  check_not_null(src, "bench copy src");
  SCALESTUDY_CHECK(reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0,
                   "bench copy buffers must be 16-byte aligned");
  const size_t vectors = elems / 4, tail = elems % 4;
  const int blocks = elementwise_blocks(vectors > 0 ? vectors : 1);
  bench_copy_kernel<<<blocks, kElementwiseThreads, 0, stream>>>(
      reinterpret_cast<float4*>(dst), reinterpret_cast<const float4*>(src), vectors, dst + 4 * vectors,
      src + 4 * vectors, tail);
  CHECK_LAUNCH();
}

}  // namespace scalestudy::cuda
