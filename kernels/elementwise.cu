#include "elementwise.cuh"

#include "common.cuh"

namespace scalestudy::cuda {
namespace {

// No __restrict__ in this file: out (or dst) may alias an input, as on the CPU, and
// each element is read and written by the same thread.
__global__ void residual_forward_kernel(float* out, const float* a, const float* b,
                                        size_t elems) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(float* dst, const float* src, size_t elems) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x)
    dst[i] += src[i];
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

}  // namespace

// An empty range is a valid request (an empty tensor piece) and launches nothing.

void launch_residual_forward(cudaStream_t stream, float* out, const float* a, const float* b,
                             size_t elems) {
  if (elems == 0) return;
  check_not_null(out, "residual out");
  check_not_null(a, "residual a");
  check_not_null(b, "residual b");
  residual_forward_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(
      out, a, b, elems);
  CHECK_LAUNCH();
}

void launch_accumulate(cudaStream_t stream, float* dst, const float* src, size_t elems) {
  if (elems == 0) return;
  check_not_null(dst, "accumulate dst");
  check_not_null(src, "accumulate src");
  accumulate_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(dst, src,
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

}  // namespace scalestudy::cuda
