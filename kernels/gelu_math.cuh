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
// gelu'(x) = s + 2 x s (1 - s) u' = s (1 + 2 x e s u'). e is 2^t with
// t = -2u log2(e) = x (kGeluExp2Linear + kGeluExp2Cubic x^2): one multiply-add, two
// multiplies and the multi-function unit's ex2, whose result and __fdividef's err by a few
// fp32 ulps (tens where x < -5, where the result is below 2e-6 x), a thousandth of a
// 16-bit result's rounding; unlike 1 + tanh(u), nothing cancels in the negative tail.
// t is clamped at kGeluExp2Limit (-2u = 80), where s (1e-35) is zero to a 16-bit result
// and e s is still 1, so that e never overflows into inf * 0.
constexpr float kLog2E = 1.4426950408889634f;
constexpr float kGeluExp2Linear = -2.0f * kGeluScale * kLog2E;
constexpr float kGeluExp2Cubic = kGeluExp2Linear * kGeluCubic;
constexpr float kGeluExp2Limit = 80.0f * kLog2E;
// 2u' = 2 kGeluScale (1 + 3 kGeluCubic x^2).
constexpr float kGeluSlopeConstant = 2.0f * kGeluScale;
constexpr float kGeluSlopeSquare = kGeluSlopeConstant * kGeluCubicSlope;

__device__ inline float exp2_approx(float t) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
  return e;
}

__device__ inline float gelu_fast_exp(float x) {
  const float t = x * fmaf(kGeluExp2Cubic, x * x, kGeluExp2Linear);
  return exp2_approx(fminf(t, kGeluExp2Limit));
}

__device__ inline float gelu_fast(float x) { return __fdividef(x, 1.0f + gelu_fast_exp(x)); }

// gelu'(x) * dout.
__device__ inline float gelu_backward_fast(float x, float dout) {
  const float e = gelu_fast_exp(x);
  const float s = __fdividef(1.0f, 1.0f + e);
  const float twice_dinner = fmaf(kGeluSlopeSquare, x * x, kGeluSlopeConstant);
  return dout * s * fmaf(x * (e * s), twice_dinner, 1.0f);
}

}  // namespace scalestudy::cuda
