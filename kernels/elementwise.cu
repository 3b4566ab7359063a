#include "elementwise.cuh"

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// No __restrict__ in this file: out (or dst) may alias an input, as on the CPU, and
// each element (each pack) is read and written by the same thread.
template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, size_t elems,
                                        size_t packs) {
  constexpr int kCount = Pack<T>::kCount;
  const size_t first = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t p = first; p < packs; p += stride) {
    const Pack<T> x = load_pack(a + p * kCount), y = load_pack(b + p * kCount);
    Pack<T> sum;
#pragma unroll
    for (int k = 0; k < kCount; ++k) sum.set(k, x.get(k) + y.get(k));
    store_pack(out + p * kCount, sum);
  }
  for (size_t i = packs * kCount + first; i < elems; i += stride)
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

template <class T>
__global__ void accumulate_kernel(T* dst, const T* src, size_t elems, size_t packs) {
  constexpr int kCount = Pack<T>::kCount;
  const size_t first = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t p = first; p < packs; p += stride) {
    Pack<T> x = load_pack(dst + p * kCount);
    const Pack<T> y = load_pack(src + p * kCount);
#pragma unroll
    for (int k = 0; k < kCount; ++k) x.set(k, x.get(k) + y.get(k));
    store_pack(dst + p * kCount, x);
  }
  for (size_t i = packs * kCount + first; i < elems; i += stride)
    dst[i] = from_float<T>(to_float(dst[i]) + to_float(src[i]));
}

__global__ void scale_kernel(float* x, size_t elems, float factor) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x)
    x[i] *= factor;
}

__global__ void fill_kernel(float* dst, size_t elems, float value) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x)
    dst[i] = value;
}

template <class To, class From>
__global__ void cast_kernel(To* __restrict__ dst, const From* __restrict__ src, size_t elems) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x)
    dst[i] = from_float<To>(to_float(src[i]));
}

}  // namespace

// An empty range is a valid request (an empty tensor piece) and launches nothing.

template <class T>
void launch_residual_forward(cudaStream_t stream, T* out, const T* a, const T* b, size_t elems) {
  launch_packed<T>(stream, residual_forward_kernel<T>, elems,
                   {{out, "residual out"}, {a, "residual a"}, {b, "residual b"}}, out, a, b);
}

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

template void launch_residual_forward(cudaStream_t, float*, const float*, const float*, size_t);
template void launch_residual_forward(cudaStream_t, bf16*, const bf16*, const bf16*, size_t);
template void launch_residual_forward(cudaStream_t, fp16*, const fp16*, const fp16*, size_t);
template void launch_accumulate(cudaStream_t, float*, const float*, size_t);
template void launch_accumulate(cudaStream_t, bf16*, const bf16*, size_t);
template void launch_accumulate(cudaStream_t, fp16*, const fp16*, size_t);
template void launch_cast(cudaStream_t, bf16*, const float*, size_t);
template void launch_cast(cudaStream_t, float*, const bf16*, size_t);
template void launch_cast(cudaStream_t, fp16*, const float*, size_t);
template void launch_cast(cudaStream_t, float*, const fp16*, size_t);

}  // namespace scalestudy::cuda
