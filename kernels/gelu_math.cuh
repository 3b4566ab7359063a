#pragma once
// GPT-2's tanh GELU and its derivative on one fp32 value: as the CPU reference computes
// them (gelu, gelu_backward; the GELU kernels of gelu.cu), and in the few fast instructions
// that a GEMM's epilogue can afford (gelu_fast, gelu_backward_fast; the Hopper GEMM of
// sm90/gelu_gemm.cu). Included from .cu files only.
#include <cuda_runtime.h>

#include "core/op_params.h"

namespace scalestudy::cuda {

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

// The same function in another form: 0.5 (1 + tanh(u)) = s = 1 / (1 + e) with
// e = exp(-2u), so gelu(x) = x s, and, since 1 - tanh(u)^2 = 4 s (1 - s) and 1 - s = e s,
// gelu'(x) = s + 2 x s (1 - s) u' = s (1 + 2 x e s u'). __expf and __fdividef err by a few
// fp32 ulps (tens where x < -5, where the result is below 2e-6 x), a thousandth of a
// 16-bit result's rounding, and unlike 1 + tanh(u) nothing cancels in the negative tail.
// -2u is clamped at kGeluFastExponentLimit, where s (1e-35) is zero to a 16-bit result
// and e s is still 1, so that e never overflows into inf * 0.
constexpr float kGeluFastExponentLimit = 80.0f;

__device__ inline float gelu_fast_exp(float x) {
  return __expf(fminf(-2.0f * gelu_inner(x), kGeluFastExponentLimit));
}

__device__ inline float gelu_fast(float x) { return __fdividef(x, 1.0f + gelu_fast_exp(x)); }

// gelu'(x) * dout.
__device__ inline float gelu_backward_fast(float x, float dout) {
  const float e = gelu_fast_exp(x);
  const float s = __fdividef(1.0f, 1.0f + e);
  const float dinner = kGeluScale * (1.0f + kGeluCubicSlope * x * x);
  return dout * s * (1.0f + 2.0f * x * e * s * dinner);
}

}  // namespace scalestudy::cuda
