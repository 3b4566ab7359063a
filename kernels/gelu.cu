#include "gelu.cuh"

#include "common.cuh"

namespace scalestudy::cuda {
namespace {

// sqrt(2/pi) and the cubic coefficient of the tanh approximation.
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluCubicSlope = 3.0f * kGeluCubic;

// No __restrict__: as on the CPU, an output may alias an input (each element is read and
// written by one thread).
// The __f*_rn intrinsics keep nvcc from fusing multiply-adds, so every step rounds as
// in the CPU reference; only tanhf itself (within 2 ulp of the CPU's) can differ.
__device__ inline float gelu_inner(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  return __fmul_rn(kGeluScale, __fadd_rn(x, cube));
}

__global__ void gelu_forward_kernel(float* out, const float* inp,
                                    size_t elems) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    out[i] = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(gelu_inner(x))));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp,
                                     const float* dout, size_t elems) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = inp[i];
    const float tanh_inner = tanhf(gelu_inner(x));
    const float sech_squared = __fsub_rn(1.0f, __fmul_rn(tanh_inner, tanh_inner));
    const float dinner =
        __fmul_rn(kGeluScale, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kGeluCubicSlope, x), x)));
    const float local_grad =
        __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, tanh_inner)),
                  __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech_squared), dinner));
    dinp[i] = __fadd_rn(dinp[i], __fmul_rn(local_grad, dout[i]));
  }
}

}  // namespace

void launch_gelu_forward(cudaStream_t stream, float* out, const float* inp, size_t elems) {
  if (elems == 0) return;
  check_not_null(out, "gelu out");
  check_not_null(inp, "gelu inp");
  gelu_forward_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(out, inp,
                                                                                     elems);
  CHECK_LAUNCH();
}

void launch_gelu_backward(cudaStream_t stream, float* dinp, const float* inp, const float* dout,
                          size_t elems) {
  if (elems == 0) return;
  check_not_null(dinp, "gelu dinp");
  check_not_null(inp, "gelu inp");
  check_not_null(dout, "gelu dout");
  gelu_backward_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(
      dinp, inp, dout, elems);
  CHECK_LAUNCH();
}

}  // namespace scalestudy::cuda
