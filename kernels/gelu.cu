#include "gelu.cuh"

#include "common.cuh"
#include "core/op_params.h"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// kGeluScale and kGeluCubic (core/op_params.h) are the CPU reference's.
constexpr float kGeluCubicSlope = 3.0f * kGeluCubic;

// The __f*_rn intrinsics keep nvcc from fusing multiply-adds, so every step rounds as
// in the CPU reference; only tanhf itself (within 2 ulp of the CPU's) can differ.
__device__ inline float gelu_inner(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  return __fmul_rn(kGeluScale, __fadd_rn(x, cube));
}

__device__ inline float gelu(float x) {
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(gelu_inner(x))));
}

// gelu'(x) * dout, added to dinp where kAccumulate.
template <bool kAccumulate>
__device__ inline float gelu_backward(float dinp, float x, float dout) {
  const float tanh_inner = tanhf(gelu_inner(x));
  const float sech_squared = __fsub_rn(1.0f, __fmul_rn(tanh_inner, tanh_inner));
  const float dinner =
      __fmul_rn(kGeluScale, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kGeluCubicSlope, x), x)));
  const float local_grad =
      __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, tanh_inner)),
                __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech_squared), dinner));
  const float grad = __fmul_rn(local_grad, dout);
  return kAccumulate ? __fadd_rn(dinp, grad) : grad;
}

// No __restrict__: as on the CPU, an output may alias an input; each element (each
// 16-byte pack, where the pointers allow packs) is read and written by one thread.
template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t elems, size_t packs) {
  for_each_pack_then_element<T>(
      elems, packs,
      [&](size_t i) {
        const Pack<T> x = load_pack(inp + i);
        Pack<T> y;
#pragma unroll
        for (int k = 0; k < Pack<T>::kCount; ++k) y.set(k, gelu(x.get(k)));
        store_pack(out + i, y);
      },
      [&](size_t i) { out[i] = from_float<T>(gelu(to_float(inp[i]))); });
}

// Without kAccumulate dinp is only written: its old contents may be anything.
template <class T, bool kAccumulate>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t elems,
                                     size_t packs) {
  for_each_pack_then_element<T>(
      elems, packs,
      [&](size_t i) {
        Pack<T> grad{};
        if (kAccumulate) grad = load_pack(dinp + i);
        const Pack<T> x = load_pack(inp + i), dy = load_pack(dout + i);
#pragma unroll
        for (int k = 0; k < Pack<T>::kCount; ++k)
          grad.set(k, gelu_backward<kAccumulate>(grad.get(k), x.get(k), dy.get(k)));
        store_pack(dinp + i, grad);
      },
      [&](size_t i) {
        const float old = kAccumulate ? to_float(dinp[i]) : 0.0f;
        dinp[i] =
            from_float<T>(gelu_backward<kAccumulate>(old, to_float(inp[i]), to_float(dout[i])));
      });
}

}  // namespace

template <class T>
void launch_gelu_forward(cudaStream_t stream, T* out, const T* inp, size_t elems) {
  launch_packed<T>(stream, gelu_forward_kernel<T>, elems, {{out, "gelu out"}, {inp, "gelu inp"}},
                   out, inp);
}

template <class T>
void launch_gelu_backward(cudaStream_t stream, T* dinp, const T* inp, const T* dout, size_t elems,
                          bool accumulate_dinp) {
  const auto kernel =
      accumulate_dinp ? gelu_backward_kernel<T, true> : gelu_backward_kernel<T, false>;
  launch_packed<T>(stream, kernel, elems,
                   {{dinp, "gelu dinp"}, {inp, "gelu inp"}, {dout, "gelu dout"}}, dinp, inp, dout);
}

#define SCALESTUDY_GELU_INSTANCES(T)                                                              \
  template void launch_gelu_forward(cudaStream_t, T*, const T*, size_t);                          \
  template void launch_gelu_backward(cudaStream_t, T*, const T*, const T*, size_t, bool);
SCALESTUDY_FOR_EACH_STORAGE(SCALESTUDY_GELU_INSTANCES)
#undef SCALESTUDY_GELU_INSTANCES

}  // namespace scalestudy::cuda
