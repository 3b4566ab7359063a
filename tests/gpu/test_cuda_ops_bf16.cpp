// The CUDA backend in its two 16-bit modes, bf16 and fp16, against the fp32 CPU reference:
// every op, a whole model step, and the 16-bit memory rules (storage sizes, conversions,
// the parameters' 16-bit copy and its refresh), each test once per precision
// (CudaOpsHalf*/bf16..., CudaOpsHalf*/fp16...); then fp16's range (overflow to inf, never
// clamped, and its way into the gradient norm). With SCALESTUDY_GPU_TIMING=1 it also times
// GPT-2 small. (The file keeps its bf16 name: jobscripts/gpu_check.sh runs it by name.)
//
// Inputs that the GPU stores in 16 bits are rounded to that type on the host first, so the
// CPU reference computes from exactly the values the GPU holds. What remains is the GPU's
// own rounding. bf16 keeps 8 significant bits: rounding to nearest has relative error at
// most u = 2^-8 = 3.9e-3, and 1 ulp is at most 2^-7 = 7.8e-3 relative. fp16 keeps 11:
// u = 2^-11 = 4.9e-4, 1 ulp <= 2^-10 = 9.8e-4 relative, for normal numbers (from 2^-14 =
// 6.1e-5); below that fp16's subnormals are spaced 2^-24 = 6.0e-8 apart, an absolute
// error. Each check below is |gpu - cpu| <= atol + rtol*|cpu| against the CPU's fp32
// result, with the bound derived next to its name. Outputs are NaN-poisoned and gradients
// start from a shared random prior, as in test_cuda_ops.cpp, so unwritten elements and
// overwriting backwards fail.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/half_host.h"
#include "core/check.h"
#include "cuda_test_support.h"
#include "gemm_lt.cuh"

namespace scalestudy {
namespace {

using gpu_test::all_close;
using gpu_test::FullGradient;
using gpu_test::kGradientWrites;
using gpu_test::kShapes;
using gpu_test::OpShape;
using gpu_test::random_floats;
using gpu_test::random_ids;
using gpu_test::Tolerance;
using gpu_test::write_label;

// ---- tolerances that do not depend on the storage type -----------------------------------
// Measured for bf16 on an H200 (sm_90, CUDA 13.0): every per-op check used at most 0.39 of
// its bound (the pure-rounding ones sit at u/1e-2 = 0.39: no result landed on a
// neighbouring bf16 value); the bf16 model's loss was within 1.5e-5 of the fp32 CPU's, its
// gradients within 7.7e-3 norm-wise (block0.ln1.weight the worst). fp16's bounds are
// bf16's divided by 8 = 2^(11-8) wherever the storage rounding sets them, so the same
// derivation leaves the same margins. The fp16 suite passed on an H200 at d418548f457c
// (docs/measurements/2026-11-22-h200x2-fp16); its margins were not recorded separately.
//
// Compared with gpu == round(cpu) in the storage type: ops whose fp32 arithmetic is the
// same sequence of operations on both sides, rounded once on the GPU (embedding, residual,
// accumulate, the cross-entropy backward); and fp32 results whose fp32 counterparts are
// bit-identical (the embedding gradients, summed in the CPU's order from the same values).
constexpr Tolerance kBitExact{0.0, 0.0};
// fp32 results of identical 16-bit inputs keep the fp32 suite's bounds (test_cuda_ops.cpp
// explains them): LayerNorm mean/rstd, LayerNorm and matmul bias gradients, cross-entropy
// losses (log-sum-exp in double of the stored logits). Weight gradients are fp32 GEMMs of
// 16-bit operands: the products (8x8 or 11x11 significant bits) are exact in fp32 and the
// tensor cores accumulate in fp32, so the fp32 dot-product bound applies.
constexpr Tolerance kRowStatistics{1e-6, 1e-6};
constexpr Tolerance kColumnSum{5e-5, 1e-5};
constexpr Tolerance kSoftmax{1e-7, 2e-6};
constexpr Tolerance kFp32DotProduct{5e-5, 1e-5};
// Whole-model sums in double of 16-bit values: as the fp32 suite (1e-11 of sum|x|).
constexpr double kDoubleSumRelative = 1e-11;
// The tanh GELU's slope lies in [-0.129, 1.129]: an error in its input moves its output by
// at most 1.13 times as much.
constexpr double kGeluMaxSlope = 1.13;

// ---- tolerances set by the storage type ---------------------------------------------------
struct HalfTolerances {
  // One rounding of an fp32 value that differs from the CPU's by a few fp32 ulps (tanhf,
  // expf, or sums in another order): the nearest or the neighbouring 16-bit value, within
  // 1 ulp relative (rtol: 1e-2 >= 2^-7 for bf16, 1.25e-3 >= 2^-10 for fp16); atol keeps
  // the fp32 suite's absolute allowance for results near zero (LayerNorm 1e-6; GELU's
  // backward 5e-6, where 1 - tanh^2 cancels in fp32 on both sides), which also covers
  // fp16's subnormal spacing (6e-8).
  Tolerance rounding;
  Tolerance gelu_backward;
  // Probabilities (attention, cross-entropy): one rounding of a value within a few fp32
  // ulps of the CPU's, rtol as above; atol only for probabilities below the normal range:
  // bf16 has fp32's range (1e-30 covers underflow), fp16's subnormals below 6.1e-5 are
  // 2^-24 = 5.96e-8 apart (atol 6e-8 = one subnormal step).
  Tolerance probability;
  // Attention output: the GPU multiplies V by the 16-bit-rounded probabilities, each off
  // by u relative, so |error| <= u*sum_t2 p*|v| <= u*max|v| = u for v in [-1, 1], plus the
  // final rounding: atol >= u (5e-3 for bf16, 6.25e-4 for fp16), rtol as `rounding`.
  Tolerance attention_out;
  // 16-bit GEMM results (matmul out and dinp, attention dqkv): an fp32 dot product rounded
  // once (u relative to the result), but also intermediate roundings that are relative to
  // a term rather than to the result: the GEMM output before the bias add (u*|x.w|, with
  // |x.w| <= |out| + |bias|), dS before the dQ/dK GEMMs (u*sum|dS||K|), and (bf16 only;
  // the fp16 handle keeps them in fp32) split-K partial sums reduced in the output type.
  // So atol is relative to the tensor's scale, max|ref|: 2.56u of it (1e-2 for bf16,
  // 1.25e-3 for fp16); a wrong index or a lost accumulation is O(1) of it.
  double gemm_scaled_atol;
  double gemm_rtol;
  // Whole model (2 layers, GPT-2 initialisation) against the fp32 CPU model: ~20 ops,
  // each adding roundings of about u relative to its outputs. The loss must agree to
  // model_loss_relative; each parameter tensor's gradient to model_gradient_norm_relative
  // in norm, ||g - g_ref|| / ||g_ref|| (element-wise bounds mean little after 20
  // roundings; a wrong or missing term changes the norm at O(1)).
  double model_loss_relative;
  double model_gradient_norm_relative;
  // The model's backward runs with loss_scale = model_loss_scale / (batch*seq), on the CPU
  // as on the GPU (the norm-wise comparison does not depend on it). fp16 scales by 2^10,
  // as the trainer's loss scaling would: unscaled, this small model's activation
  // gradients (~1e-5) would sit in fp16's subnormals, where the storage keeps absolute
  // rather than relative precision; scaled they are ~1e-2, and the largest (dlogits) ~20.
  float model_loss_scale;
};

constexpr HalfTolerances kBf16Tolerances{
    /*rounding=*/{1e-6, 1e-2},
    /*gelu_backward=*/{5e-6, 1e-2},
    /*probability=*/{1e-30, 1e-2},
    /*attention_out=*/{5e-3, 1e-2},
    /*gemm_scaled_atol=*/1e-2,
    /*gemm_rtol=*/1e-2,
    /*model_loss_relative=*/1e-2,
    /*model_gradient_norm_relative=*/5e-2,
    /*model_loss_scale=*/1.0f,
};

constexpr HalfTolerances kFp16Tolerances{
    /*rounding=*/{1e-6, 1.25e-3},
    /*gelu_backward=*/{5e-6, 1.25e-3},
    /*probability=*/{6e-8, 1.25e-3},
    /*attention_out=*/{6.25e-4, 1.25e-3},
    /*gemm_scaled_atol=*/1.25e-3,
    /*gemm_rtol=*/1.25e-3,
    /*model_loss_relative=*/1.25e-3,
    /*model_gradient_norm_relative=*/6.25e-3,
    /*model_loss_scale=*/1024.0f,
};

const HalfTolerances& tolerances_of(Precision precision) {
  return precision == Precision::fp16 ? kFp16Tolerances : kBf16Tolerances;
}

double max_abs(const std::vector<float>& values) {
  double largest = 0.0;
  for (float value : values) largest = std::max(largest, double{std::fabs(value)});
  return largest;
}

const char* storage_name(Precision precision) { return precision_name(precision); }

// A CudaOps in one of the 16-bit modes, with the helpers that round like its storage.
class CudaOpsHalfTest : public gpu_test::CudaOpsFixture {
 protected:
  explicit CudaOpsHalfTest(Precision precision)
      : CudaOpsFixture(precision), tol_(tolerances_of(precision)) {}

  // The values the 16-bit storage holds for `values`.
  std::vector<float> rounded(std::vector<float> values) const {
    for (float& value : values) value = round_to_storage(precision_, value);
    return values;
  }
  Tolerance gemm_tolerance(const std::vector<float>& ref) const {
    return Tolerance{tol_.gemm_scaled_atol * max_abs(ref), tol_.gemm_rtol};
  }
  // The GELU of a GEMM result x, or the GELU's derivative times one: x's error (within
  // gemm_tolerance, at most (gemm_scaled_atol + gemm_rtol) * max|x|) reaches the result at
  // most kGeluMaxSlope times larger - relative to x's scale, not to the result's, which is
  // ~100 times smaller than x past x = -3 - and the result is rounded once more (gemm_rtol).
  // The fused path's GELU takes x before its 16-bit rounding, the plain path after it: both
  // lie within this.
  Tolerance gelu_of_gemm_tolerance(const std::vector<float>& gemm_ref) const {
    return Tolerance{kGeluMaxSlope * (tol_.gemm_scaled_atol + tol_.gemm_rtol) * max_abs(gemm_ref),
                     tol_.gemm_rtol};
  }
  std::string name() const { return storage_name(precision_); }

  // A 16-bit activation buffer holding `values` (which should already be rounded).
  float* activation(const std::vector<float>& values) {
    return upload(values, MemoryKind::activations);
  }
  float* poisoned_activation(size_t elems) { return poisoned(elems, MemoryKind::activations); }
  // The check, printing how much of the bound the worst element used.
  void expect_close(const std::string& what, const float* device, const std::vector<float>& ref,
                    Tolerance tolerance) {
    const auto result = all_close(what, download(device, ref.size()), ref, tolerance);
    EXPECT_TRUE(result);
    if (result)
      std::cout << "  " << name() << " " << what << ": worst error/bound " << result.message()
                << "\n";
  }

  // LayerNorm forward and backward, both ways of writing dinp, against the CPU at one
  // [rows, channels] shape.
  void check_layernorm(int N, int C, const std::string& shape_label) {
    const auto inp = rounded(random_floats(size_t(N) * C, 20, -3.0f, 5.0f));
    const auto weight = random_floats(C, 21, 0.5f, 1.5f), bias = random_floats(C, 22);
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    float *d_out = poisoned_activation(out.size()), *d_mean = poisoned(N), *d_rstd = poisoned(N);
    const float *d_inp = activation(inp), *d_weight = upload(weight);
    cpu_.layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    gpu_->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, upload(bias), N, C);
    expect_close("layernorm out" + shape_label, d_out, out, tol_.rounding);
    expect_close("layernorm mean" + shape_label, d_mean, mean, kRowStatistics);
    expect_close("layernorm rstd" + shape_label, d_rstd, rstd, kRowStatistics);

    const auto dout = rounded(random_floats(inp.size(), 23));
    for (GradientWrite write : kGradientWrites) {
      const std::string label = shape_label + write_label(write);
      auto dinp = rounded(random_floats(inp.size(), 24));
      auto dweight = random_floats(C, 25), dbias = random_floats(C, 26);
      float* d_dinp =
          write == GradientWrite::accumulate ? activation(dinp) : poisoned_activation(dinp.size());
      float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
      cpu_.layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                              weight.data(), mean.data(), rstd.data(), N, C, write);
      gpu_->layernorm_backward(d_dinp, d_dweight, d_dbias, activation(dout), d_inp, d_weight,
                               upload(mean), upload(rstd), N, C, write);
      expect_close("layernorm dinp" + label, d_dinp, dinp, tol_.rounding);
      expect_close("layernorm dweight" + label, d_dweight, dweight, kColumnSum);
      expect_close("layernorm dbias" + label, d_dbias, dbias, kColumnSum);
    }
  }

  // The cross-entropy forward and backward (out of place and in place) against the CPU
  // on [N, V] logits.
  void check_cross_entropy(int N, int V, const std::string& label) {
    const auto logits = rounded(random_floats(size_t(N) * V, 70, -6.0f, 6.0f));
    const auto targets = random_ids(N, 71, V);
    std::vector<float> losses(N), row_stats(2 * size_t(N));
    float* d_losses = gpu_->allocate_statistics(N);
    float* d_stats = gpu_->allocate_statistics(row_stats.size());
    owned_.push_back(d_losses);
    owned_.push_back(d_stats);
    float* d_logits = activation(logits);
    const int32_t* d_targets = upload(targets);
    cpu_.softmax_cross_entropy_forward(losses.data(), row_stats.data(), logits.data(), targets.data(), N, V);
    gpu_->softmax_cross_entropy_forward(d_losses, d_stats, d_logits, d_targets, N, V);
    expect_close("cross-entropy losses" + label, d_losses, losses, kSoftmax);
    expect_close("cross-entropy row max and 1/sum" + label, d_stats, row_stats, kSoftmax);

    // The gradient is computed in fp32 from the stored logits and rounded once: the nearest
    // or the neighbouring 16-bit value of the CPU's, as for a probability.
    const float loss_scale = 1.0f / static_cast<float>(N);
    std::vector<float> dlogits(logits.size());
    float* d_dlogits = poisoned_activation(logits.size());
    cpu_.softmax_cross_entropy_backward(dlogits.data(), logits.data(), row_stats.data(), targets.data(), N, V,
                                        loss_scale);
    gpu_->softmax_cross_entropy_backward(d_dlogits, d_logits, d_stats, d_targets, N, V, loss_scale);
    expect_close("cross-entropy dlogits" + label, d_dlogits, dlogits, tol_.probability);
    gpu_->softmax_cross_entropy_backward(d_logits, d_logits, d_stats, d_targets, N, V, loss_scale);
    expect_close("cross-entropy dlogits in place" + label, d_logits, download(d_dlogits, logits.size()), kBitExact);
  }

  // GPT-2's MLP, C -> 4C -> C on N rows, through the dense-GELU pair against the CPU's (its
  // defaults, the plain ops): the forward of the first layer, and the second layer's
  // backward through the GELU. Weights sit at offsets in the parameters, as the model's do,
  // scaled by 1/sqrt(fan-in) so that the GELU's input spreads over its curved part (about
  // [-3, 3]) rather than its linear tails. Everything the ops write starts as NaN, the
  // parameter gradients from a random prior. Returns how many of the two calls ran a GELU
  // epilogue.
  size_t check_dense_gelu(int N, int C, const std::string& label) {
    const int H = 4 * C;
    const size_t fc_weight_at = 8, fc_bias_at = fc_weight_at + size_t(H) * C;
    const size_t proj_weight_at = fc_bias_at + H, proj_bias_at = proj_weight_at + size_t(C) * H;
    std::vector<float> params(proj_bias_at + C, 0.0f);
    auto fill = [&](size_t at, size_t elems, uint64_t seed, float bound) {
      const auto values = rounded(random_floats(elems, seed, -bound, bound));
      std::copy(values.begin(), values.end(), params.begin() + at);
    };
    fill(fc_weight_at, size_t(H) * C, 80, 2.0f / std::sqrt(float(C)));
    fill(fc_bias_at, H, 81, 0.5f);
    fill(proj_weight_at, size_t(C) * H, 82, 2.0f / std::sqrt(float(H)));
    fill(proj_bias_at, C, 83, 0.5f);
    float* d_params = upload(params, MemoryKind::parameters);
    gpu_->parameters_changed(d_params, 0, params.size());
    const size_t before = gpu_->gelu_epilogue_gemms();

    const auto inp = rounded(random_floats(size_t(N) * C, 84));
    std::vector<float> pre(size_t(N) * H), out(pre.size());
    float *d_pre = poisoned_activation(pre.size()), *d_out = poisoned_activation(pre.size());
    cpu_.dense_gelu_forward(pre.data(), out.data(), inp.data(), params.data() + fc_weight_at,
                            params.data() + fc_bias_at, N, C, H);
    gpu_->dense_gelu_forward(d_pre, d_out, activation(inp), d_params + fc_weight_at,
                             d_params + fc_bias_at, N, C, H);
    expect_close("dense gelu pre" + label, d_pre, pre, gemm_tolerance(pre));
    expect_close("dense gelu out" + label, d_out, out, gelu_of_gemm_tolerance(pre));

    // Both sides go backward from the same 16-bit pre and act = gelu(pre).
    const auto pre_stored = rounded(pre);
    std::vector<float> act(pre.size());
    cpu_.gelu_forward(act.data(), pre_stored.data(), act.size());
    act = rounded(act);
    const auto dout = rounded(random_floats(size_t(N) * C, 85));
    const float* proj_weight = params.data() + proj_weight_at;
    // The gradient of act that the GELU's derivative multiplies, for the tolerance's scale.
    std::vector<float> dact(act.size()), unused_dweight(size_t(C) * H);
    cpu_.matmul_backward(dact.data(), unused_dweight.data(), nullptr, dout.data(), act.data(),
                         proj_weight, N, H, C, GradientWrite::overwrite);
    std::vector<float> dpre(pre.size()), scratch(pre.size());
    auto dweight = random_floats(size_t(C) * H, 86), dbias = random_floats(C, 87);
    float *d_dpre = poisoned_activation(pre.size()), *d_scratch = poisoned_activation(pre.size());
    float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
    cpu_.dense_backward_through_gelu(dpre.data(), dweight.data(), dbias.data(), dout.data(),
                                     act.data(), pre_stored.data(), proj_weight, N, H, C,
                                     scratch.data());
    gpu_->dense_backward_through_gelu(d_dpre, d_dweight, d_dbias, activation(dout), activation(act),
                                      activation(pre_stored), d_params + proj_weight_at, N, H, C,
                                      d_scratch);
    expect_close("dense gelu dpre" + label, d_dpre, dpre, gelu_of_gemm_tolerance(dact));
    expect_close("dense gelu dweight" + label, d_dweight, dweight, kFp32DotProduct);
    expect_close("dense gelu dbias" + label, d_dbias, dbias, kColumnSum);
    return gpu_->gelu_epilogue_gemms() - before;
  }

  const HalfTolerances& tol_;
};

class CudaOpsBf16 : public CudaOpsHalfTest {
 protected:
  CudaOpsBf16() : CudaOpsHalfTest(Precision::bf16) {}
};

// WithParamInterface comes first so that GetParam() is usable in the constructor.
class CudaOpsHalf : public ::testing::WithParamInterface<Precision>, public CudaOpsHalfTest {
 protected:
  CudaOpsHalf() : CudaOpsHalfTest(GetParam()) {}
};

class CudaOpsHalfShapes : public ::testing::WithParamInterface<std::tuple<Precision, OpShape>>,
                          public CudaOpsHalfTest {
 protected:
  CudaOpsHalfShapes() : CudaOpsHalfTest(std::get<0>(GetParam())) {}
  OpShape shape() const { return std::get<1>(GetParam()); }
};

constexpr Precision kHalfPrecisions[] = {Precision::bf16, Precision::fp16};

// ---- memory rules -------------------------------------------------------------------

TEST_P(CudaOpsHalf, StorageSizesAndConversions) {
  EXPECT_EQ(gpu_->precision(), precision_);
  const auto values = random_floats(1000, 1, -3.0f, 3.0f);
  float* activations = upload(values, MemoryKind::activations);
  float* statistics = gpu_->allocate_statistics(10);
  owned_.push_back(statistics);
  float* gradients = upload(values, MemoryKind::gradients);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::activations), 1000 * 2 + 10 * 4u);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::gradients), 1000 * 4u);
  const size_t params_before = gpu_->allocated_bytes(MemoryKind::parameters);
  float* params = gpu_->allocate_floats(100, MemoryKind::parameters);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::parameters), params_before + 100 * (4 + 2u))
      << "the parameters' 16-bit copy is counted with them";
  gpu_->release(params);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::parameters), params_before);

  // copy_from_host rounds to nearest even; copy_to_host widens exactly.
  const auto stored = rounded(values);
  EXPECT_TRUE(all_close(name() + " round trip", download(activations, 1000), stored, kBitExact));
  // Device copies convert in both directions (the device's rounding is the host's), and
  // between 16-bit buffers they are copies.
  float* other_activations = poisoned_activation(1000);
  gpu_->copy(other_activations, gradients, 1000);
  EXPECT_TRUE(all_close("fp32 -> " + name() + " copy", download(other_activations, 1000), stored,
                        kBitExact));
  float* widened = poisoned(1000);
  gpu_->copy(widened, activations, 1000);
  EXPECT_TRUE(all_close(name() + " -> fp32 copy", download(widened, 1000), stored, kBitExact));
  gpu_->fill_zero(other_activations, 999);
  gpu_->copy(activations, other_activations, 1000);
  std::vector<float> zeroed(1000, 0.0f);
  zeroed[999] = stored[999];
  EXPECT_TRUE(all_close("fill_zero then " + name() + " copy", download(activations, 1000), zeroed,
                        kBitExact));
  double magnitude = 0.0;
  for (float value : stored) magnitude += std::fabs(value);
  EXPECT_TRUE(all_close("sum of " + name(), std::vector<double>{gpu_->sum(other_activations, 1000)},
                        std::vector<double>{cpu_.sum(zeroed.data(), 1000)},
                        Tolerance{kDoubleSumRelative * magnitude, 0.0}));
}

// GEMMs read the parameters' 16-bit copy at the weight's offset: NaN until
// parameters_changed fills it, and then exactly the ranges it is told about.
TEST_P(CudaOpsHalf, GemmsReadTheRefreshedParameterCopy) {
  const int N = 16, IC = 32, OC = 24;
  const size_t weight_at = 8, bias_at = weight_at + size_t(OC) * IC, param_elems = bias_at + OC;
  auto params = rounded(random_floats(param_elems, 2));
  float* d_params = upload(params, MemoryKind::parameters);
  const auto inp = rounded(random_floats(size_t(N) * IC, 3));
  const float* d_inp = activation(inp);
  float* d_out = poisoned_activation(size_t(N) * OC);
  std::vector<float> out(size_t(N) * OC);
  auto forward = [&] {
    cpu_.matmul_forward(out.data(), inp.data(), params.data() + weight_at, params.data() + bias_at,
                        N, IC, OC);
    gpu_->matmul_forward(d_out, d_inp, d_params + weight_at, d_params + bias_at, N, IC, OC);
  };
  forward();
  const auto stale = download(d_out, out.size());
  EXPECT_TRUE(std::all_of(stale.begin(), stale.end(), [](float v) { return std::isnan(v); }))
      << "before parameters_changed the 16-bit copy must be NaN";
  gpu_->parameters_changed(d_params, 0, param_elems);
  forward();
  expect_close("matmul after parameters_changed", d_out, out, gemm_tolerance(out));

  // New values everywhere, but only the first half of the weight rows announced, and the
  // bias: the GEMM must use new rows [0, OC/2) and old rows after. (The bias is announced
  // because the 16-bit forward reads it from the copy in cuBLASLt's epilogue, and from the
  // fp32 master in the bias kernel where the epilogue declines.)
  const auto fresh = rounded(random_floats(param_elems, 4));
  gpu_->copy_from_host(d_params, fresh.data(), param_elems);
  const size_t announced_end = weight_at + size_t(OC / 2) * IC;
  gpu_->parameters_changed(d_params + weight_at, 0, announced_end - weight_at);
  gpu_->parameters_changed(d_params, bias_at, param_elems);
  std::copy(fresh.begin() + weight_at, fresh.begin() + announced_end, params.begin() + weight_at);
  std::copy(fresh.begin() + bias_at, fresh.end(), params.begin() + bias_at);
  forward();
  expect_close("matmul after a partial refresh", d_out, out, gemm_tolerance(out));
}

// ---- per-op comparisons -------------------------------------------------------------

TEST_P(CudaOpsHalfShapes, Embedding) {
  const OpShape s = shape();
  const size_t N = s.rows(), C = s.channels;
  const auto tokens = random_ids(N, 10, s.vocab);
  const auto wte = random_floats(s.vocab * C, 11), wpe = random_floats(s.seq * C, 12);
  std::vector<float> out(N * C);
  float* d_out = poisoned_activation(out.size());
  const int32_t* d_tokens = upload(tokens);
  cpu_.embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), s.batch, s.seq, s.channels);
  gpu_->embedding_forward(d_out, d_tokens, upload(wte), upload(wpe), s.batch, s.seq, s.channels);
  expect_close("embedding out", d_out, rounded(out), kBitExact);

  const auto dout = rounded(random_floats(N * C, 13));
  auto dwte = random_floats(wte.size(), 14), dwpe = random_floats(wpe.size(), 15);
  float *d_dwte = upload(dwte), *d_dwpe = upload(dwpe);
  cpu_.embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.batch, s.seq, s.channels);
  gpu_->embedding_backward(d_dwte, d_dwpe, activation(dout), d_tokens, s.batch, s.seq, s.channels);
  expect_close("dwte (repeated tokens)", d_dwte, dwte, kBitExact);
  expect_close("dwpe", d_dwpe, dwpe, kBitExact);
}

TEST_P(CudaOpsHalfShapes, LayerNorm) {
  const OpShape s = shape();
  check_layernorm(s.rows(), s.channels, "");
}

// The kernels hold a row in registers up to 8 packs per lane (C <= 2048 in 16 bits), with
// kernels compiled per pack count, and fall back to a block per row beyond: GPT-2's
// widths (768, 1024, 1280, 1600), the widest register row (2048, whose backward needs
// more than 48 KB of shared memory) and the first width past it. 70 rows leave the last
// chunk of 32 rows partly empty.
TEST_P(CudaOpsHalf, LayerNormAtModelWidths) {
  for (int channels : {768, 1024, 1280, 1600, 2048, 2056})
    check_layernorm(70, channels, " (C=" + std::to_string(channels) + ")");
}

TEST_P(CudaOpsHalfShapes, Matmul) {
  const OpShape s = shape();
  const int N = s.rows(), C = s.channels;
  struct Case {
    int in_channels, out_channels;
    bool bias;
  };
  for (const Case& c : {Case{C, 3 * C, true}, Case{4 * C, C, true}, Case{C, s.vocab, false}}) {
    const std::string label = " (" + std::to_string(c.in_channels) + "->" +
                              std::to_string(c.out_channels) + (c.bias ? ", bias)" : ", no bias)");
    // The weight sits 8 elements into the parameters (as the model's weights sit at
    // offsets), the bias after it; both are fp32 masters of 16-bit values.
    const size_t weight_elems = size_t(c.out_channels) * c.in_channels;
    const size_t weight_at = 8, bias_at = weight_at + weight_elems;
    const auto params = rounded(random_floats(bias_at + c.out_channels, 31));
    float* d_params = upload(params, MemoryKind::parameters);
    gpu_->parameters_changed(d_params, 0, params.size());
    const float* weight = params.data() + weight_at;
    const float* bias = c.bias ? params.data() + bias_at : nullptr;
    const float* d_bias = c.bias ? d_params + bias_at : nullptr;

    const auto inp = rounded(random_floats(size_t(N) * c.in_channels, 30));
    std::vector<float> out(size_t(N) * c.out_channels);
    float* d_out = poisoned_activation(out.size());
    const float* d_inp = activation(inp);
    cpu_.matmul_forward(out.data(), inp.data(), weight, bias, N, c.in_channels, c.out_channels);
    gpu_->matmul_forward(d_out, d_inp, d_params + weight_at, d_bias, N, c.in_channels, c.out_channels);
    expect_close("matmul out" + label, d_out, out, gemm_tolerance(out));

    const auto dout = rounded(random_floats(out.size(), 33));
    for (GradientWrite write : kGradientWrites) {
      const std::string labels = label + write_label(write);
      auto dinp = rounded(random_floats(inp.size(), 34));
      auto dweight = random_floats(weight_elems, 35), dbias = random_floats(c.out_channels, 36);
      float* d_dinp =
          write == GradientWrite::accumulate ? activation(dinp) : poisoned_activation(dinp.size());
      float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
      cpu_.matmul_backward(dinp.data(), dweight.data(), c.bias ? dbias.data() : nullptr, dout.data(),
                           inp.data(), weight, N, c.in_channels, c.out_channels, write);
      gpu_->matmul_backward(d_dinp, d_dweight, c.bias ? d_dbias : nullptr, activation(dout), d_inp,
                            d_params + weight_at, N, c.in_channels, c.out_channels, write);
      expect_close("matmul dinp" + labels, d_dinp, dinp, gemm_tolerance(dinp));
      expect_close("matmul dweight" + labels, d_dweight, dweight, kFp32DotProduct);
      expect_close("matmul dbias" + labels, d_dbias, dbias, kColumnSum);
    }
  }
}

// GPT-2's dense layers take their bias in cuBLASLt's epilogue (no bias kernel): the
// epilogue must accept their shapes, or the step silently keeps the slower fallback.
// Where the operands are not 16-byte aligned it declines, and the GEMM-then-bias path
// (the Matmul test's tiny shape) runs instead.
TEST_P(CudaOpsHalf, BiasEpilogueTakesTheGpt2Shapes) {
  cuda::EpilogueGemm bias_gemm;
  cudaStream_t stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(gpu_->cublas_handle(), &stream));
  const cudaDataType_t type = precision_ == Precision::fp16 ? CUDA_R_16F : CUDA_R_16BF;
  const int N = 256;
  for (const auto& [in_channels, out_channels] :
       std::vector<std::pair<int, int>>{{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}}) {
    const std::string label = " (" + std::to_string(in_channels) + "->" +
                              std::to_string(out_channels) + ")";
    const auto inp = rounded(random_floats(size_t(N) * in_channels, 37));
    const auto weight = rounded(random_floats(size_t(out_channels) * in_channels, 38));
    const auto bias = rounded(random_floats(size_t(out_channels), 39));
    std::vector<float> out(size_t(N) * out_channels);
    float* d_out = poisoned_activation(out.size());
    float* d_bias = activation(bias);  // a 16-bit bias, as the parameters' copy holds it
    ASSERT_TRUE(bias_gemm.forward(stream, type, d_out, activation(inp), activation(weight), d_bias,
                                  N, in_channels, out_channels))
        << "cuBLASLt declined the bias epilogue" << label;
    cpu_.matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, in_channels, out_channels);
    expect_close("bias epilogue out" + label, d_out, out, gemm_tolerance(out));
    const auto* misaligned_bias = reinterpret_cast<const char*>(d_bias) + 2;
    EXPECT_FALSE(bias_gemm.forward(stream, type, d_out, activation(inp), activation(weight),
                                   misaligned_bias, N, in_channels, out_channels))
        << "a bias 2 bytes off 16-byte alignment must be declined" << label;
  }
}

TEST_P(CudaOpsHalfShapes, Attention) {
  const OpShape s = shape();
  const size_t N = s.rows(), C = s.channels, T = s.seq;
  const size_t probs_elems = size_t(s.batch) * s.heads * T * T;
  for (bool causal : {true, false}) {
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    const AttentionShape shape{s.batch, s.seq, s.channels, s.heads, causal};
    const auto qkv = rounded(random_floats(N * 3 * C, 40));
    std::vector<float> out(N * C), probs(probs_elems);
    float *d_out = poisoned_activation(out.size()), *d_probs = poisoned_activation(probs_elems);
    const float* d_qkv = activation(qkv);
    cpu_.attention_forward(out.data(), probs.data(), qkv.data(), shape);
    gpu_->attention_forward(d_out, d_probs, d_qkv, shape);
    expect_close("attention out" + label, d_out, out, tol_.attention_out);
    expect_close("attention probs" + label, d_probs, probs, tol_.probability);
    if (causal) {
      const auto gpu_probs = download(d_probs, probs_elems);
      size_t unmasked = 0;
      for (size_t row = 0; row < probs_elems / T; ++row)
        for (size_t t2 = row % T + 1; t2 < T; ++t2) unmasked += gpu_probs[row * T + t2] != 0.0f;
      EXPECT_EQ(unmasked, 0u) << "masked probabilities must be exact zeros";
    }

    // Both sides take the 16-bit rounding of the CPU's probabilities.
    const auto probs_rounded = rounded(probs);
    const auto dout = rounded(random_floats(N * C, 41));
    for (GradientWrite write : kGradientWrites) {
      auto dqkv = rounded(random_floats(qkv.size(), 42));
      float* d_dqkv =
          write == GradientWrite::accumulate ? activation(dqkv) : poisoned_activation(dqkv.size());
      cpu_.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), probs_rounded.data(),
                              shape, write);
      gpu_->attention_backward(d_dqkv, activation(dout), d_qkv, d_out, activation(probs_rounded),
                               shape, write);
      expect_close("attention dqkv" + label + write_label(write), d_dqkv, dqkv, gemm_tolerance(dqkv));
    }
  }
}

TEST_P(CudaOpsHalfShapes, Gelu) {
  const OpShape s = shape();
  const size_t elems = size_t(s.rows()) * 4 * s.channels + 5;  // +5: a ragged tail
  const auto inp = rounded(random_floats(elems, 50, -5.0f, 5.0f));
  std::vector<float> out(elems);
  float* d_out = poisoned_activation(elems);
  const float* d_inp = activation(inp);
  cpu_.gelu_forward(out.data(), inp.data(), elems);
  gpu_->gelu_forward(d_out, d_inp, elems);
  expect_close("gelu out", d_out, out, tol_.rounding);
  const auto dout = rounded(random_floats(elems, 51));
  for (GradientWrite write : kGradientWrites) {
    auto dinp = rounded(random_floats(elems, 52));
    float* d_dinp = write == GradientWrite::accumulate ? activation(dinp) : poisoned_activation(elems);
    cpu_.gelu_backward(dinp.data(), inp.data(), dout.data(), elems, write);
    gpu_->gelu_backward(d_dinp, d_inp, activation(dout), elems, write);
    expect_close("gelu dinp" + write_label(write), d_dinp, dinp, tol_.gelu_backward);
  }
}

TEST_P(CudaOpsHalfShapes, ResidualAndAccumulate) {
  const OpShape s = shape();
  const size_t elems = size_t(s.rows()) * s.channels + 3;  // +3: a ragged tail
  const auto a = rounded(random_floats(elems, 60)), b = rounded(random_floats(elems, 61));
  std::vector<float> out(elems);
  float* d_out = poisoned_activation(elems);
  const float *d_a = activation(a), *d_b = activation(b);
  cpu_.residual_forward(out.data(), a.data(), b.data(), elems);
  gpu_->residual_forward(d_out, d_a, d_b, elems);
  out = rounded(out);
  expect_close("residual out", d_out, out, kBitExact);
  cpu_.accumulate(out.data(), b.data(), elems);
  gpu_->accumulate(d_out, d_b, elems);
  expect_close("accumulate", d_out, rounded(out), kBitExact);
}

TEST_P(CudaOpsHalfShapes, SoftmaxCrossEntropy) {
  const OpShape s = shape();
  check_cross_entropy(s.rows(), s.vocab, "");
}

// GPT-2's vocabulary on enough rows that each row gets one warp, whose row spans many
// chunks of loads (the running max moves between them), at every alignment of a row.
TEST_P(CudaOpsHalf, SoftmaxCrossEntropyAtGpt2Vocabulary) {
  check_cross_entropy(4096, 50257, " (4096 x 50257)");
}

// The classifier on logits from allocate_logits, whose rows are padded to a multiple of 8
// (V = 517 and 11 here; 1000 needs none): against the same ops on a plain [N,V] buffer,
// which run the same GEMMs on a padded copy, and against the CPU.
TEST_P(CudaOpsHalfShapes, ClassifierOnPaddedLogits) {
  const OpShape s = shape();
  const int N = s.rows(), C = s.channels, V = s.vocab;
  const size_t weight_at = 8;  // weights sit at offsets in the parameters, as the model's
  const auto params = rounded(random_floats(weight_at + size_t(V) * C, 73));
  float* d_params = upload(params, MemoryKind::parameters);
  gpu_->parameters_changed(d_params, 0, params.size());
  const float* d_weight = d_params + weight_at;
  const auto inp = rounded(random_floats(size_t(N) * C, 74));
  const auto targets = random_ids(N, 75, V);
  const float* d_inp = activation(inp);
  const int32_t* d_targets = upload(targets);
  const float loss_scale = 1.0f / static_cast<float>(N);
  auto statistics = [&](size_t elems) {
    float* p = gpu_->allocate_statistics(elems);
    owned_.push_back(p);
    return p;
  };

  // The plain path: matmul into [N,V], cross-entropy, its backward, the matmul backward.
  float* plain_logits = poisoned_activation(size_t(N) * V);
  float *plain_losses = statistics(N), *plain_stats = statistics(2 * size_t(N));
  gpu_->matmul_forward(plain_logits, d_inp, d_weight, nullptr, N, C, V);
  gpu_->softmax_cross_entropy_forward(plain_losses, plain_stats, plain_logits, d_targets, N, V);
  gpu_->softmax_cross_entropy_backward(plain_logits, plain_logits, plain_stats, d_targets, N, V, loss_scale);
  const auto dinp_prior = rounded(random_floats(inp.size(), 76));
  const auto dweight_prior = random_floats(size_t(V) * C, 77);
  float *plain_dinp = activation(dinp_prior), *plain_dweight = upload(dweight_prior);
  gpu_->matmul_backward(plain_dinp, plain_dweight, nullptr, plain_logits, d_inp, d_weight, N, C, V,
                        GradientWrite::accumulate);

  float* logits = gpu_->allocate_logits(N, V);
  owned_.push_back(logits);
  float *losses = statistics(N), *stats = statistics(2 * size_t(N));
  float *dinp = activation(dinp_prior), *dweight = upload(dweight_prior);
  gpu_->classifier_forward(losses, stats, logits, d_inp, d_weight, d_targets, N, C, V);
  gpu_->classifier_backward(dinp, dweight, logits, stats, d_inp, d_weight, d_targets, N, C, V, loss_scale,
                            GradientWrite::accumulate);
  // The same GEMMs on the same operands; the row reductions may split a row differently.
  expect_close("classifier losses vs plain", losses, download(plain_losses, N), kSoftmax);
  expect_close("classifier row statistics vs plain", stats, download(plain_stats, 2 * size_t(N)), kSoftmax);
  expect_close("classifier dinp vs plain", dinp, download(plain_dinp, inp.size()), kBitExact);
  expect_close("classifier dweight vs plain", dweight, download(plain_dweight, dweight_prior.size()),
               kBitExact);

  // Against the CPU's fp32 classifier: the GPU rounds each logit to 16 bits (u relative),
  // which moves a loss by at most 2u * max|logit|, and dinp as a GEMM of the gradients.
  const float* weight = params.data() + weight_at;
  std::vector<float> cpu_logits(size_t(N) * V), cpu_losses(N), cpu_stats(2 * size_t(N));
  std::vector<float> cpu_dinp = dinp_prior, cpu_dweight = dweight_prior;
  cpu_.classifier_forward(cpu_losses.data(), cpu_stats.data(), cpu_logits.data(), inp.data(), weight,
                          targets.data(), N, C, V);
  const double unit = precision_ == Precision::fp16 ? 0x1p-11 : 0x1p-8;
  expect_close("classifier losses vs cpu", losses, cpu_losses, Tolerance{2 * unit * max_abs(cpu_logits), 0.0});
  cpu_.classifier_backward(cpu_dinp.data(), cpu_dweight.data(), cpu_logits.data(), cpu_stats.data(), inp.data(),
                           weight, targets.data(), N, C, V, loss_scale, GradientWrite::accumulate);
  expect_close("classifier dinp vs cpu", dinp, cpu_dinp, gemm_tolerance(cpu_dinp));

  // Overwriting, the padded path writes dinp = dlogits @ weight into a NaN buffer, which
  // it must never read: against the CPU's overwrite. dweight still accumulates, with the
  // plain path's bits.
  float* overwritten = poisoned_activation(inp.size());
  float* scratch_dweight = upload(dweight_prior);
  gpu_->classifier_forward(losses, stats, logits, d_inp, d_weight, d_targets, N, C, V);
  gpu_->classifier_backward(overwritten, scratch_dweight, logits, stats, d_inp, d_weight, d_targets, N, C, V,
                            loss_scale, GradientWrite::overwrite);
  std::vector<float> cpu_overwritten(inp.size()), cpu_scratch_dweight = dweight_prior;
  cpu_.classifier_forward(cpu_losses.data(), cpu_stats.data(), cpu_logits.data(), inp.data(), weight,
                          targets.data(), N, C, V);
  cpu_.classifier_backward(cpu_overwritten.data(), cpu_scratch_dweight.data(), cpu_logits.data(),
                           cpu_stats.data(), inp.data(), weight, targets.data(), N, C, V, loss_scale,
                           GradientWrite::overwrite);
  expect_close("classifier dinp vs cpu" + write_label(GradientWrite::overwrite), overwritten, cpu_overwritten,
               gemm_tolerance(cpu_overwritten));
  expect_close("classifier dweight, overwriting dinp, vs plain", scratch_dweight,
               download(plain_dweight, dweight_prior.size()), kBitExact);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsHalfShapes,
                         ::testing::Combine(::testing::ValuesIn(kHalfPrecisions),
                                            ::testing::ValuesIn(kShapes)),
                         [](const auto& info) {
                           return std::string(storage_name(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param).name;
                         });

// ---- a whole model step -------------------------------------------------------------

// Head size 16 runs the cuBLAS attention; head size 64 the fused kernels
// (allocate_attention_state keeps the log-sum-exp), over more than one 64-row tile.
struct WholeModelCase {
  int channels, heads, seq;
  const char* attention;
};

TEST_P(CudaOpsHalf, WholeModelLossAndGradientsMatchTheFp32Cpu) {
  for (const WholeModelCase& model_case : {WholeModelCase{64, 4, 17, "cuBLAS attention"},
                                           WholeModelCase{128, 2, 70, "fused attention"}})
  for (bool causal : {true, false}) {
    const std::string label = std::string(causal ? " (causal, " : " (bidirectional, ") + model_case.attention + ")";
    const ModelShape shape{2, model_case.channels, model_case.heads, 101, 80, causal};
    const int batch = 3, seq = model_case.seq;
    const ParameterLayout layout = make_parameter_layout(shape);
    const size_t param_elems = layout.param_elems;
    Gpt cpu_model(cpu_, shape, batch, seq, param_elems);
    Gpt gpu_model(*gpu_, shape, batch, seq, param_elems);
    cpu_model.initialize(1234);
    gpu_model.initialize(1234);
    gpu_->parameters_changed(gpu_model.params(), 0, param_elems);
    const auto inputs = random_ids(size_t(batch) * seq, 100, shape.vocab);
    const auto targets = random_ids(size_t(batch) * seq, 101, shape.vocab);

    cpu_model.forward(inputs.data(), targets.data(), nullptr);
    gpu_model.forward(inputs.data(), targets.data(), nullptr);
    const double cpu_loss = cpu_model.mean_loss(), gpu_loss = gpu_model.mean_loss();
    const double loss_error = std::fabs(gpu_loss - cpu_loss) / std::fabs(cpu_loss);
    EXPECT_LE(loss_error, tol_.model_loss_relative) << "loss" << label << ": gpu " << gpu_loss
                                              << ", cpu " << cpu_loss;
    std::cout << "  loss" << label << ": cpu " << cpu_loss << ", " << name() << " gpu " << gpu_loss
              << ", relative error " << loss_error << "\n";

    const float loss_scale = tol_.model_loss_scale / static_cast<float>(batch * seq);
    std::vector<float> cpu_grads(param_elems, 0.0f);
    FullGradient cpu_sink(layout, cpu_grads.data());
    cpu_model.backward(cpu_sink, loss_scale);
    float* d_grads = upload(std::vector<float>(param_elems, 0.0f), MemoryKind::gradients);
    FullGradient gpu_sink(layout, d_grads);
    gpu_model.backward(gpu_sink, loss_scale);
    const auto gpu_grads = download(d_grads, param_elems);

    double worst = 0.0;
    std::string worst_name;
    for (const TensorSpec& tensor : layout.tensors) {
      double difference = 0.0, reference = 0.0;
      for (size_t i = tensor.offset_elems; i < tensor.offset_elems + tensor.elems; ++i) {
        const double delta = double{gpu_grads[i]} - double{cpu_grads[i]};
        difference += delta * delta;
        reference += double{cpu_grads[i]} * cpu_grads[i];
      }
      ASSERT_GT(reference, 0.0) << tensor.name << label << ": an all-zero gradient tests nothing";
      const double relative = std::sqrt(difference / reference);
      EXPECT_LE(relative, tol_.model_gradient_norm_relative) << "gradient of " << tensor.name << label;
      if (relative > worst) {
        worst = relative;
        worst_name = tensor.name;
      }
    }
    std::cout << "  gradients" << label << ": worst norm-wise relative error " << worst << " ("
              << worst_name << ")\n";

    // Deterministic in 16 bits too: the same step gives the same bits.
    gpu_model.forward(inputs.data(), targets.data(), nullptr);
    EXPECT_EQ(gpu_model.mean_loss(), gpu_loss) << "repeated forward" << label;
    gpu_->fill_zero(d_grads, param_elems);
    gpu_model.backward(gpu_sink, loss_scale);
    EXPECT_TRUE(all_close("repeated backward" + label, download(d_grads, param_elems), gpu_grads,
                          kBitExact));
  }
}

// ---- timings (SCALESTUDY_GPU_TIMING=1) ----------------------------------------------------

// Median milliseconds per call of `work` over 5 trials of `reps` calls, after one warm-up
// trial, timed with events on the compute stream.
double median_ms(CudaOps& ops, int reps, const std::function<void()>& work) {
  cudaEvent_t begin, end;
  EXPECT_EQ(cudaEventCreate(&begin), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&end), cudaSuccess);
  std::vector<double> trials;
  for (int trial = 0; trial < 6; ++trial) {
    cudaEventRecord(begin, ops.stream());
    for (int r = 0; r < reps; ++r) work();
    cudaEventRecord(end, ops.stream());
    cudaEventSynchronize(end);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, begin, end);
    if (trial > 0) trials.push_back(ms / reps);
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  std::sort(trials.begin(), trials.end());
  std::cout << "    (spread " << trials.front() << " .. " << trials.back() << " ms)";
  return trials[trials.size() / 2];
}

// GPT-2 small (124M) at batch 8, seq 1024: the forward + backward of one micro-batch in
// the 16-bit precision (and, in the bf16 instance, fp32), and the 16-bit ops one by one.
TEST_P(CudaOpsHalf, Gpt2SmallTimings) {
  const char* enabled = std::getenv("SCALESTUDY_GPU_TIMING");
  if (enabled == nullptr || std::string(enabled) != "1")
    GTEST_SKIP() << "set SCALESTUDY_GPU_TIMING=1 to time GPT-2 small";
  const ModelShape shape{12, 768, 12, 50257, 1024, true};
  const int B = 8, T = 1024, N = B * T, C = 768, V = 50257;
  const auto inputs = random_ids(size_t(N), 100, V), targets = random_ids(size_t(N), 101, V);
  const float loss_scale = tol_.model_loss_scale / static_cast<float>(N);
  std::vector<Precision> precisions{precision_};
  if (precision_ == Precision::bf16) precisions.push_back(Precision::fp32);
  for (Precision precision : precisions) {
    CudaOps ops(0, precision);
    const ParameterLayout layout = make_parameter_layout(shape);
    Gpt model(ops, shape, B, T, layout.param_elems);
    model.initialize(1);
    ops.parameters_changed(model.params(), 0, layout.param_elems);
    float* grads = ops.allocate_floats(layout.param_elems, MemoryKind::gradients);
    ops.fill_zero(grads, layout.param_elems);
    FullGradient sink(layout, grads);
    const std::string mode = storage_name(precision);
    std::cout << "  " << mode << " forward";
    const double forward_ms =
        median_ms(ops, 1, [&] { model.forward(inputs.data(), targets.data(), nullptr); });
    std::cout << "\n  " << mode << " forward+backward";
    const double step_ms = median_ms(ops, 1, [&] {
      model.forward(inputs.data(), targets.data(), nullptr);
      model.backward(sink, loss_scale);
    });
    // A whole ddp step on one GPU: zeroed gradients, the gradient norm, AdamW, and the
    // refresh of the parameters' 16-bit copy.
    float* m = ops.allocate_floats(layout.param_elems, MemoryKind::optimizer);
    float* v = ops.allocate_floats(layout.param_elems, MemoryKind::optimizer);
    ops.fill_zero(m, layout.param_elems);
    ops.fill_zero(v, layout.param_elems);
    AdamWParams hyper;
    hyper.learning_rate = 1e-4f;
    std::cout << "\n  " << mode << " full step";
    const double full_ms = median_ms(ops, 1, [&] {
      ops.fill_zero(grads, layout.param_elems);
      model.forward(inputs.data(), targets.data(), nullptr);
      model.backward(sink, loss_scale);
      (void)ops.sum_of_squares(grads, layout.param_elems);
      ops.adamw_update(model.params(), grads, m, v, layout.param_elems, hyper);
      ops.parameters_changed(model.params(), 0, layout.param_elems);
    });
    std::cout << "\n  " << mode << ": forward " << forward_ms << " ms, forward+backward " << step_ms
              << " ms = " << N / (step_ms * 1e-3) << " tokens/s; full step " << full_ms
              << " ms = " << N / (full_ms * 1e-3) << " tokens/s (loss " << model.mean_loss()
              << ")\n";
    ops.release(m);
    ops.release(v);
    ops.release(grads);
  }

  // The 16-bit ops at GPT-2 small shapes.
  CudaOps& ops = *gpu_;
  auto act = [&](size_t elems) {
    float* p = ops.allocate_floats(elems, MemoryKind::activations);
    owned_.push_back(p);
    ops.fill_zero(p, elems);
    return p;
  };
  auto fp32 = [&](size_t elems, MemoryKind kind) {
    float* p = ops.allocate_floats(elems, kind);
    owned_.push_back(p);
    ops.fill_zero(p, elems);
    return p;
  };
  const size_t NC = size_t(N) * C, param_elems = size_t(V) * C + 4 * C;
  float* params = fp32(param_elems, MemoryKind::parameters);
  ops.parameters_changed(params, 0, param_elems);
  float* grads = fp32(param_elems, MemoryKind::gradients);
  float *x = act(NC), *y = act(NC), *wide = act(4 * NC), *wide2 = act(4 * NC);
  float *qkv = act(3 * NC), *dqkv = act(3 * NC), *probs = act(size_t(B) * 12 * T * T);
  float *logits = act(size_t(N) * V), *dlogits = act(size_t(N) * V), *scratch_weight = act(size_t(V) * C);
  float* padded_logits = ops.allocate_logits(N, V);
  owned_.push_back(padded_logits);
  float *stats = ops.allocate_statistics(2 * size_t(N)), *losses = ops.allocate_statistics(N);
  owned_.push_back(stats);
  owned_.push_back(losses);
  int32_t* d_targets = ops.allocate_ints(N, MemoryKind::activations);
  owned_.push_back(d_targets);
  ops.copy_ints_from_host(d_targets, targets.data(), N);
  const AttentionShape att{B, T, C, 12, true};
  // The backward ops write their input gradients as the model's step does.
  constexpr GradientWrite kFirst = GradientWrite::overwrite;
  struct Timed {
    const char* name;
    int reps;
    std::function<void()> work;
  };
  const std::vector<Timed> timed = {
      {"matmul fwd 768->2304", 10, [&] { ops.matmul_forward(qkv, x, params, params + 1, N, C, 3 * C); }},
      {"matmul bwd 768->2304", 10, [&] { ops.matmul_backward(x, grads, grads + 1, qkv, x, params, N, C, 3 * C, kFirst); }},
      {"matmul fwd 768->3072", 10, [&] { ops.matmul_forward(wide, x, params, params + 1, N, C, 4 * C); }},
      {"matmul bwd 768->3072", 10, [&] { ops.matmul_backward(x, grads, grads + 1, wide, x, params, N, C, 4 * C, kFirst); }},
      {"matmul fwd 3072->768", 10, [&] { ops.matmul_forward(x, wide, params, params + 1, N, 4 * C, C); }},
      {"matmul bwd 3072->768", 10, [&] { ops.matmul_backward(wide, grads, grads + 1, x, wide, params, N, 4 * C, C, kFirst); }},
      {"matmul fwd 768->768", 10, [&] { ops.matmul_forward(y, x, params, params + 1, N, C, C); }},
      {"matmul fwd LM head", 3, [&] { ops.matmul_forward(logits, x, params, nullptr, N, C, V); }},
      {"matmul bwd LM head", 3, [&] { ops.matmul_backward(x, grads, nullptr, dlogits, x, params, N, C, V, kFirst); }},
      {"attention fwd", 5, [&] { ops.attention_forward(y, probs, qkv, att); }},
      {"attention bwd", 5, [&] { ops.attention_backward(dqkv, y, qkv, y, probs, att, kFirst); }},
      {"layernorm fwd", 10, [&] { ops.layernorm_forward(y, stats, stats + N, x, params, params, N, C); }},
      {"layernorm bwd", 10, [&] { ops.layernorm_backward(x, grads, grads + C, y, x, params, stats, stats + N, N, C, kFirst); }},
      {"gelu fwd", 10, [&] { ops.gelu_forward(wide2, wide, 4 * NC); }},
      {"gelu bwd", 10, [&] { ops.gelu_backward(wide2, wide, wide, 4 * NC, kFirst); }},
      {"residual fwd", 10, [&] { ops.residual_forward(y, x, y, NC); }},
      {"fill_zero 4NC", 10, [&] { ops.fill_zero(wide, 4 * NC); }},
      {"cross-entropy fwd", 3, [&] { ops.softmax_cross_entropy_forward(losses, stats, logits, d_targets, N, V); }},
      {"cross-entropy bwd", 3, [&] { ops.softmax_cross_entropy_backward(dlogits, logits, stats, d_targets, N, V, loss_scale); }},
      {"classifier fwd (padded logits)", 3, [&] { ops.classifier_forward(losses, stats, padded_logits, x, params, d_targets, N, C, V); }},
      {"classifier bwd (padded logits)", 3, [&] { ops.classifier_backward(y, grads, padded_logits, stats, x, params, d_targets, N, C, V, loss_scale, kFirst); }},
      {"parameters_changed 38.6M (wte + 4C)", 3, [&] { ops.parameters_changed(params, 0, param_elems); }},
  };
  for (const Timed& t : timed) {
    std::cout << "  " << name() << " " << t.name;
    const double ms = median_ms(ops, t.reps, t.work);
    std::cout << ": " << ms << " ms\n";
  }

  // The LM head's rows are V = 50257 16-bit values long, not a multiple of 16 bytes; the
  // same three GEMMs with rows padded to a multiple of 8 show what that alignment costs.
  // The buffers are untyped here: only the cuBLAS data type says bf16 or fp16.
  const int padded_vocab = (V + 7) / 8 * 8;
  float* padded = act(size_t(N) * padded_vocab);
  const float one = 1.0f, zero = 0.0f;
  const cublasHandle_t handle = ops.cublas_handle();
  const cudaDataType_t half_type = precision_ == Precision::fp16 ? CUDA_R_16F : CUDA_R_16BF;
  const void* weight = scratch_weight;
  for (int ld : {V, padded_vocab}) {
    void* head_out = ld == V ? logits : padded;
    const void* lnf = x;
    void* dlnf = y;
    const std::string label = " (ld " + std::to_string(ld) + ")";
    std::cout << "  raw GEMM LM head fwd" << label;
    std::cout << ": " << median_ms(ops, 3, [&] {
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, &one, weight, half_type, C, lnf,
                   half_type, C, &zero, head_out, half_type, ld, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    }) << " ms\n";
    std::cout << "  raw GEMM LM head dinp" << label;
    std::cout << ": " << median_ms(ops, 3, [&] {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, &one, weight, half_type, C,
                   head_out, half_type, ld, &one, dlnf, half_type, C, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    }) << " ms\n";
    std::cout << "  raw GEMM LM head dweight" << label;
    std::cout << ": " << median_ms(ops, 3, [&] {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, &one, lnf, half_type, C,
                   head_out, half_type, ld, &one, grads, CUDA_R_32F, C, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    }) << " ms\n";
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaOpsHalf, ::testing::ValuesIn(kHalfPrecisions),
                         [](const auto& info) { return std::string(storage_name(info.param)); });

// ---- fp16's range ---------------------------------------------------------------------
// fp16 ends at 65504. A result beyond it must become +-inf - on the host, in the device
// casts and in the kernels alike, never clamped to 65504 - so that it reaches the fp32
// weight gradients and their norm, where the trainer's dynamic loss scaling looks for it.
// Below 2^-14 values lose precision into the subnormals, and below 2^-25 they vanish.
class CudaOpsFp16Range : public CudaOpsHalfTest {
 protected:
  CudaOpsFp16Range() : CudaOpsHalfTest(Precision::fp16) {}
};

TEST_F(CudaOpsFp16Range, OverflowIsInfNotClampedAndReachesTheGradientNorm) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Value, and what fp16 storage holds for it (round to nearest even).
  const std::vector<float> values{65504.0f, 65519.0f, 65520.0f, 70000.0f, -70000.0f, 1e5f,
                                  kInf,     0x1p-14f, 0x1p-24f, 0x1.8p-25f, 1e-8f, 2049.0f};
  const std::vector<float> expected{65504.0f, 65504.0f, kInf,     kInf,  -kInf, kInf,
                                    kInf,     0x1p-14f, 0x1p-24f, 0x1p-24f, 0.0f, 2048.0f};
  auto expect_equal = [](const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << what << ", element " << i;
  };
  // The host's rounding (copy_from_host), the device's (a cast from fp32), and the
  // reference table all agree.
  std::vector<float> host_rounded = rounded(values);
  expect_equal("round_to_fp16", host_rounded, expected);
  float* from_host = activation(values);
  expect_equal("copy_from_host", download(from_host, values.size()), expected);
  float* fp32_values = upload(values, MemoryKind::gradients);
  float* from_device = poisoned_activation(values.size());
  gpu_->copy(from_device, fp32_values, values.size());
  expect_equal("device cast", download(from_device, values.size()), expected);

  // A kernel result beyond the range: 40000 + 40000 stores inf, not 65504.
  const int N = 8, IC = 16, OC = 8;
  std::vector<float> a = rounded(random_floats(size_t(N) * OC, 90));
  std::vector<float> b = rounded(random_floats(size_t(N) * OC, 91));
  a[0] = b[0] = 40000.0f;
  float* dout = poisoned_activation(a.size());
  gpu_->residual_forward(dout, activation(a), activation(b), a.size());
  const auto sums = download(dout, a.size());
  EXPECT_EQ(sums[0], kInf) << "40000 + 40000 in fp16";
  for (size_t i = 1; i < sums.size(); ++i) ASSERT_TRUE(std::isfinite(sums[i])) << i;

  // That overflowed activation gradient, through a matmul backward: the fp32 weight
  // gradient row of output channel 0 becomes inf (inp > 0, so no inf * 0), and so does
  // the gradient norm.
  const auto params = rounded(random_floats(size_t(OC) * IC, 92));
  float* d_params = upload(params, MemoryKind::parameters);
  gpu_->parameters_changed(d_params, 0, params.size());
  const auto inp = rounded(random_floats(size_t(N) * IC, 93, 0.5f, 1.0f));
  float* dinp = activation(std::vector<float>(inp.size(), 0.0f));
  float* dweight = upload(std::vector<float>(params.size(), 0.0f), MemoryKind::gradients);
  gpu_->matmul_backward(dinp, dweight, nullptr, dout, activation(inp), d_params, N, IC, OC,
                        GradientWrite::accumulate);
  const auto gradient = download(dweight, params.size());
  for (int i = 0; i < IC; ++i) EXPECT_EQ(gradient[i], kInf) << "dweight[0, " << i << "]";
  for (size_t i = IC; i < gradient.size(); ++i)
    EXPECT_TRUE(std::isfinite(gradient[i])) << "dweight element " << i;
  EXPECT_FALSE(std::isfinite(gpu_->sum_of_squares(dweight, params.size())))
      << "the gradient norm must show the overflow";

  // And a GEMM whose fp32 accumulation exceeds the range stores inf: 64 products of
  // 64 * 32 = 2048 sum to 131072 > 65504.
  const int K = 64;
  const std::vector<float> ones_weight(size_t(OC) * K, 32.0f);
  float* d_weight = upload(ones_weight, MemoryKind::parameters);
  gpu_->parameters_changed(d_weight, 0, ones_weight.size());
  float* big_out = poisoned_activation(size_t(N) * OC);
  gpu_->matmul_forward(big_out, activation(std::vector<float>(size_t(N) * K, 64.0f)), d_weight,
                       nullptr, N, K, OC);
  const auto big = download(big_out, size_t(N) * OC);
  EXPECT_TRUE(std::all_of(big.begin(), big.end(), [](float v) { return v == kInf; }))
      << "a GEMM result of 131072 must store inf, not 65504";
}

// ---- GPT-2's MLP GELU in cuBLASLt's epilogues ---------------------------------------------

// The dense-GELU pair against the CPU at the op shapes. The medium and odd shapes' channels
// are multiples of 8, which the epilogues need; the tiny shape's (C = 6) are not, so it
// runs the plain ops, which must agree just as well.
TEST_P(CudaOpsHalfShapes, DenseGelu) {
  const OpShape s = shape();
  const size_t fused = check_dense_gelu(s.rows(), s.channels, "");
  std::cout << "  " << name() << " GELU epilogue GEMMs: " << fused << " of 2\n";
  if (s.channels % 8 != 0 || precision_ == Precision::fp16) {
    EXPECT_EQ(fused, 0u) << "fp16, and channels that are not a multiple of 8, take the plain ops";
  }
}

// GPT-2 small's MLP (768 -> 3072 -> 768): in bf16 both ops must run in cuBLASLt's GELU
// epilogues, or the step silently keeps the GELU kernels and their passes over memory.
// fp16 keeps the GELU kernels: cuBLASLt's fp16 GELU misses the fp16 rounding
// (CudaOps::gelu_epilogues_allowed).
TEST_P(CudaOpsHalf, DenseGeluTakesTheEpiloguesAtGpt2Small) {
  const size_t expected = precision_ == Precision::bf16 ? 2 : 0;
  EXPECT_EQ(check_dense_gelu(256, 768, " (GPT-2 small, 256 rows)"), expected)
      << "bf16 must take both GELU epilogues at GPT-2 small's MLP shape, fp16 neither";
}

// The two epilogues at GPT-2 small's shapes, on inputs that make every GEMM exact, so that
// what is left to compare is the GELU itself: one-hot rows pick one weight (plus the bias)
// as the GELU's input, and a one-hot dout with weights of +-1 makes the derivative's
// multiplier exactly +-1. The fused GELU must be the tanh approximation (the CPU's); the
// inputs span [-5, 5], where the erf GELU fails the same checks (its value differs by up
// to 11 % near x = -3, its slope by more), which the test asserts as well. bf16 only: in
// fp16 cuBLASLt's GELU misses the fp16 rounding, so the backend keeps fp16 off these
// epilogues (CudaOps::gelu_epilogues_allowed).
TEST_F(CudaOpsBf16, GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu) {
  cuda::EpilogueGemm epilogue_gemm;
  cudaStream_t stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(gpu_->cublas_handle(), &stream));
  const cudaDataType_t type = precision_ == Precision::fp16 ? CUDA_R_16F : CUDA_R_16BF;
  const int N = 256, C = 768, H = 4 * C;
  const size_t NH = size_t(N) * H;
  const double sqrt_two = std::sqrt(2.0), sqrt_two_pi = std::sqrt(2.0 * std::acos(-1.0));
  auto erf_gelu = [&](double x) { return 0.5 * x * (1.0 + std::erf(x / sqrt_two)); };
  auto erf_gelu_slope = [&](double x) {
    return 0.5 * (1.0 + std::erf(x / sqrt_two)) + x * std::exp(-0.5 * x * x) / sqrt_two_pi;
  };

  // Forward, 768 -> 3072: pre[n, o] = weight[o, n % C] + bias[o], exact in fp32.
  std::vector<float> inp(size_t(N) * C, 0.0f);
  for (int n = 0; n < N; ++n) inp[size_t(n) * C + n % C] = 1.0f;
  const auto weight = rounded(random_floats(size_t(H) * C, 90, -4.0f, 4.0f));
  const auto bias = rounded(random_floats(H, 91));
  std::vector<float> pre(NH);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < H; ++o) pre[size_t(n) * H + o] = weight[size_t(o) * C + n % C] + bias[o];
  float *d_pre = poisoned_activation(NH), *d_out = poisoned_activation(NH);
  const float *d_inp = activation(inp), *d_weight = activation(weight), *d_bias = activation(bias);
  ASSERT_TRUE(epilogue_gemm.gelu_forward(stream, type, d_pre, d_out, d_inp, d_weight, d_bias, N,
                                         C, H))
      << "cuBLASLt declined the GELU epilogue (768->3072)";
  expect_close("GELU epilogue pre (its auxiliary output)", d_pre, rounded(pre), kBitExact);
  std::vector<float> out(NH), erf_out(NH);
  cpu_.gelu_forward(out.data(), pre.data(), NH);
  for (size_t i = 0; i < NH; ++i) erf_out[i] = static_cast<float>(erf_gelu(pre[i]));
  expect_close("GELU epilogue out", d_out, out, tol_.rounding);
  EXPECT_FALSE(all_close("erf GELU", rounded(erf_out), out, tol_.rounding))
      << "these inputs must tell the erf GELU from the tanh GELU";
  void* misaligned_pre = reinterpret_cast<char*>(d_pre) + 2;
  EXPECT_FALSE(epilogue_gemm.gelu_forward(stream, type, misaligned_pre, d_out, d_inp, d_weight,
                                          d_bias, N, C, H))
      << "an auxiliary output 2 bytes off 16-byte alignment must be declined";

  // The input gradient of 3072 -> 768: dact[n, i] = proj_weight[n % C, i] = +-1.
  std::vector<float> dout(size_t(N) * C, 0.0f);
  for (int n = 0; n < N; ++n) dout[size_t(n) * C + n % C] = 1.0f;
  const auto signs = random_ids(size_t(C) * H, 92, 2);
  std::vector<float> proj_weight(signs.size());
  for (size_t i = 0; i < signs.size(); ++i) proj_weight[i] = signs[i] == 0 ? -1.0f : 1.0f;
  const auto gelu_input = rounded(random_floats(NH, 93, -5.0f, 5.0f));
  std::vector<float> dact(NH);
  for (int n = 0; n < N; ++n)
    std::copy_n(proj_weight.begin() + size_t(n % C) * H, H, dact.begin() + size_t(n) * H);
  std::vector<float> dpre(NH), erf_dpre(NH);
  cpu_.gelu_backward(dpre.data(), gelu_input.data(), dact.data(), NH, GradientWrite::overwrite);
  for (size_t i = 0; i < NH; ++i)
    erf_dpre[i] = static_cast<float>(erf_gelu_slope(gelu_input[i]) * dact[i]);
  float* d_dpre = poisoned_activation(NH);
  const float *d_dout = activation(dout), *d_proj_weight = activation(proj_weight);
  const float* d_gelu_input = activation(gelu_input);
  ASSERT_TRUE(epilogue_gemm.gelu_input_gradient(stream, type, d_dpre, d_dout, d_proj_weight,
                                                d_gelu_input, N, H, C))
      << "cuBLASLt declined the GELU derivative's epilogue (3072->768)";
  expect_close("GELU epilogue dpre", d_dpre, dpre, tol_.gelu_backward);
  EXPECT_FALSE(all_close("erf GELU's derivative", rounded(erf_dpre), dpre, tol_.gelu_backward))
      << "these inputs must tell the erf GELU's derivative from the tanh GELU's";
  const void* misaligned_input = reinterpret_cast<const char*>(d_gelu_input) + 2;
  EXPECT_FALSE(epilogue_gemm.gelu_input_gradient(stream, type, d_dpre, d_dout, d_proj_weight,
                                                 misaligned_input, N, H, C))
      << "an auxiliary input 2 bytes off 16-byte alignment must be declined";
}

// With SCALESTUDY_GPU_TIMING=1: GPT-2 small's MLP at batch 8, seq 1024, through the plain
// ops and through the dense-GELU pair (per layer; the model has 12).
TEST_P(CudaOpsHalf, DenseGeluTimings) {
  const char* enabled = std::getenv("SCALESTUDY_GPU_TIMING");
  if (enabled == nullptr || std::string(enabled) != "1")
    GTEST_SKIP() << "set SCALESTUDY_GPU_TIMING=1 to time the MLP's GELU";
  const int N = 8192, C = 768, H = 4 * C;
  const size_t NH = size_t(N) * H;
  const size_t fc_bias_at = size_t(H) * C, proj_weight_at = fc_bias_at + H;
  const size_t param_elems = proj_weight_at + size_t(C) * H + C;
  float* params = upload(rounded(random_floats(param_elems, 94, -0.05f, 0.05f)), MemoryKind::parameters);
  gpu_->parameters_changed(params, 0, param_elems);
  float* grads = upload(std::vector<float>(param_elems, 0.0f), MemoryKind::gradients);
  const float *fc_weight = params, *fc_bias = params + fc_bias_at;
  const float* proj_weight = params + proj_weight_at;
  float *proj_dweight = grads + proj_weight_at, *proj_dbias = grads + proj_weight_at + size_t(C) * H;
  const float* ln2 = activation(rounded(random_floats(size_t(N) * C, 95)));
  const float* dout = activation(rounded(random_floats(size_t(N) * C, 96)));
  float *fch = poisoned_activation(NH), *fch_gelu = poisoned_activation(NH);
  float *dfch = poisoned_activation(NH), *dfch_gelu = poisoned_activation(NH);
  constexpr GradientWrite kFirst = GradientWrite::overwrite;
  struct Timed {
    const char* name;
    std::function<void()> work;
  };
  const std::vector<Timed> timed{
      {"fc fwd + gelu fwd (plain)", [&] {
         gpu_->matmul_forward(fch, ln2, fc_weight, fc_bias, N, C, H);
         gpu_->gelu_forward(fch_gelu, fch, NH);
       }},
      {"dense_gelu_forward", [&] { gpu_->dense_gelu_forward(fch, fch_gelu, ln2, fc_weight, fc_bias, N, C, H); }},
      {"fc_proj bwd + gelu bwd (plain)", [&] {
         gpu_->matmul_backward(dfch_gelu, proj_dweight, proj_dbias, dout, fch_gelu, proj_weight, N, H, C, kFirst);
         gpu_->gelu_backward(dfch, fch, dfch_gelu, NH, kFirst);
       }},
      {"dense_backward_through_gelu", [&] {
         gpu_->dense_backward_through_gelu(dfch, proj_dweight, proj_dbias, dout, fch_gelu, fch, proj_weight, N, H,
                                           C, dfch_gelu);
       }},
  };
  const size_t before = gpu_->gelu_epilogue_gemms();
  for (const Timed& t : timed) {
    std::cout << "  " << name() << " " << t.name;
    const double ms = median_ms(*gpu_, 10, t.work);
    std::cout << ": " << ms << " ms\n";
  }
  std::cout << "  " << name() << " GELU epilogue GEMMs in the fused runs: "
            << gpu_->gelu_epilogue_gemms() - before << "\n";
}

}  // namespace
}  // namespace scalestudy
