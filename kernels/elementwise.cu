#include "elementwise.cuh"

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// dst += src, each fp32 sum rounded once. No __restrict__: src may alias dst, as on the
// CPU, and each element (each pack) is read and written by the same thread.
template <class T>
__global__ void accumulate_kernel(T* dst, const T* src, size_t elems, size_t packs) {
  for_each_pack_then_element<T>(
      elems, packs,
      [&](size_t i) {
        const Pack<T> x = load_pack(dst + i), y = load_pack(src + i);
        Pack<T> sum;
#pragma unroll
        for (int k = 0; k < Pack<T>::kCount; ++k) sum.set(k, x.get(k) + y.get(k));
        store_pack(dst + i, sum);
      },
      [&](size_t i) { dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i])); });
}

__global__ void scale_kernel(float* x, size_t elems, float factor) {
  for (size_t i = grid_thread_index(); i < elems; i += grid_threads()) x[i] *= factor;
}

__global__ void fill_kernel(float* dst, size_t elems, float value) {
  for (size_t i = grid_thread_index(); i < elems; i += grid_threads()) dst[i] = value;
}

template <class To, class From>
__global__ void cast_kernel(To* __restrict__ dst, const From* __restrict__ src, size_t elems) {
  for (size_t i = grid_thread_index(); i < elems; i += grid_threads())
    dst[i] = from_float<To>(to_float(src[i]));
}

}  // namespace

// An empty range is a valid request (an empty tensor piece) and launches nothing.

template <class T>
void launch_accumulate(cudaStream_t stream, T* dst, const T* src, size_t elems) {
  launch_packed<T>(stream, accumulate_kernel<T>, elems,
                   {{dst, "accumulate dst"}, {src, "accumulate src"}}, dst, src);
}

template <class To, class From>
void launch_cast(cudaStream_t stream, To* dst, const From* src, size_t elems) {
  if (elems == 0) return;
  check_not_null(dst, "cast dst");
  check_not_null(src, "cast src");
  cast_kernel<To, From><<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(dst, src,
                                                                                     elems);
  CHECK_LAUNCH();
}

void launch_scale(cudaStream_t stream, float* x, size_t elems, float factor) {
  if (elems == 0) return;
  check_not_null(x, "scale x");
  scale_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(x, elems, factor);
  CHECK_LAUNCH();
}

void launch_fill(cudaStream_t stream, float* dst, size_t elems, float value) {
  if (elems == 0) return;
  check_not_null(dst, "fill dst");
  fill_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(dst, elems, value);
  CHECK_LAUNCH();
}

#define SCALESTUDY_ELEMENTWISE_INSTANCES(T)                                                       \
  template void launch_accumulate(cudaStream_t, T*, const T*, size_t);
SCALESTUDY_FOR_EACH_STORAGE(SCALESTUDY_ELEMENTWISE_INSTANCES)
#undef SCALESTUDY_ELEMENTWISE_INSTANCES
// Between the fp32 values and each 16-bit storage, both ways.
#define SCALESTUDY_CAST_INSTANCES(T)                                                              \
  template void launch_cast(cudaStream_t, T*, const float*, size_t);                              \
  template void launch_cast(cudaStream_t, float*, const T*, size_t);
SCALESTUDY_FOR_EACH_16BIT_STORAGE(SCALESTUDY_CAST_INSTANCES)
#undef SCALESTUDY_CAST_INSTANCES

// The copy kernel of `scalestudy bench bandwidth`, whose buffers never overlap: as little
// as possible between the loads and the stores, so that its rate is the memory system's. 16-byte accesses halve
// the instructions per byte against scalar ones, and a grid-stride loop over a capped
// grid keeps every multiprocessor streaming whatever the size.
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
