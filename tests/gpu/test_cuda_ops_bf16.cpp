// The CUDA backend in bf16 mode against the fp32 CPU reference: every op, a whole model
// step, and the bf16 memory rules (storage sizes, conversions, the parameters' bf16 copy
// and its refresh). With SCALESTUDY_GPU_TIMING=1 it also times GPT-2 small.
//
// Inputs that the GPU stores in bf16 are rounded to bf16 on the host first, so the CPU
// reference computes from exactly the values the GPU holds. What remains is the GPU's own
// rounding. bf16 keeps 8 significant bits: rounding to nearest has relative error at most
// u = 2^-8 = 3.9e-3, and 1 ulp is at most 2^-7 = 7.8e-3 relative. Each check below is
// |gpu - cpu| <= atol + rtol*|cpu| against the CPU's fp32 result, with the bound derived
// next to its name. Outputs are NaN-poisoned and gradients start from a shared random
// prior, as in test_cuda_ops.cpp, so unwritten elements and overwriting backwards fail.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "backend/cuda/bf16_host.h"
#include "core/usage_error.h"
#include "cuda_test_support.h"

namespace scalestudy {
namespace {

using gpu_test::all_close;
using gpu_test::FullGradient;
using gpu_test::kShapes;
using gpu_test::OpShape;
using gpu_test::random_floats;
using gpu_test::random_ids;
using gpu_test::Tolerance;

// ---- tolerances, bf16 -----------------------------------------------------------------
// Measured on an H200 (sm_90, CUDA 13.0): every per-op check used at most 0.39 of its bound
// (the pure-rounding ones sit at u/1e-2 = 0.39: no result landed on a neighbouring bf16
// value); the bf16 model's loss was within 1.5e-5 of the fp32 CPU's, its gradients within
// 7.7e-3 norm-wise (block0.ln1.weight the worst).
// Compared with gpu == round_to_bf16(cpu): ops whose fp32 arithmetic is the same sequence
// of operations on both sides, rounded once to bf16 on the GPU (embedding, residual,
// accumulate, the cross-entropy backward); and fp32 results whose fp32 counterparts are
// bit-identical (the embedding gradients, summed in the CPU's order from the same values).
constexpr Tolerance kBitExact{0.0, 0.0};
// One rounding of an fp32 value that differs from the CPU's by a few fp32 ulps (tanhf,
// expf, or sums in another order): the nearest or the neighbouring bf16 value, within
// 1 ulp <= 2^-7 relative; atol keeps the fp32 suite's absolute allowance for results near
// zero (LayerNorm 1e-6; GELU's backward 5e-6, where 1 - tanh^2 cancels).
constexpr Tolerance kBf16Rounding{1e-6, 1e-2};
constexpr Tolerance kBf16GeluBackward{5e-6, 1e-2};
// Probabilities (attention, cross-entropy): one rounding of a value within a few fp32 ulps
// of the CPU's; atol only for probabilities that underflow.
constexpr Tolerance kBf16Probability{1e-30, 1e-2};
// fp32 results of identical bf16 inputs keep the fp32 suite's bounds (test_cuda_ops.cpp
// explains them): LayerNorm mean/rstd, LayerNorm and matmul bias gradients, cross-entropy
// losses (log-sum-exp in double of the stored logits). Weight gradients are fp32 GEMMs of
// bf16 operands: the products are exact in fp32 and the tensor cores accumulate in fp32,
// so the fp32 dot-product bound applies.
constexpr Tolerance kRowStatistics{1e-6, 1e-6};
constexpr Tolerance kColumnSum{5e-5, 1e-5};
constexpr Tolerance kSoftmax{1e-7, 2e-6};
constexpr Tolerance kFp32DotProduct{5e-5, 1e-5};
// bf16 GEMM results (matmul out and dinp, attention dqkv): an fp32 dot product rounded
// once (u relative to the result), but also intermediate roundings that are relative to a
// term rather than to the result: the GEMM output before the bias add (u*|x.w|, with
// |x.w| <= |out| + |bias|), dS before the dQ/dK GEMMs (u*sum|dS||K|), and split-K partial
// sums where cuBLAS reduces them in the output type. So atol is relative to the tensor's
// scale, max|ref|: 1e-2 = 2.5u of it; a wrong index or a lost accumulation is O(1) of it.
constexpr double kBf16GemmScaledAtol = 1e-2;
constexpr double kBf16GemmRtol = 1e-2;
// Attention output: the GPU multiplies V by the bf16-rounded probabilities, each off by
// u relative, so |error| <= u*sum_t2 p*|v| <= u*max|v| = u for v in [-1, 1], plus the
// final rounding: atol 5e-3 >= u, rtol 1e-2.
constexpr Tolerance kBf16AttentionOut{5e-3, 1e-2};
// Whole-model sums in double of bf16 values: as the fp32 suite (1e-11 of sum|x|).
constexpr double kDoubleSumRelative = 1e-11;
// Whole model in bf16 (2 layers, GPT-2 initialisation) against the fp32 CPU model: ~20 ops,
// each adding roundings of about u relative to its outputs. The loss must agree to 1e-2
// relative; each parameter tensor's gradient to 5e-2 in norm, ||g - g_ref|| / ||g_ref||
// (element-wise bounds mean little after 20 roundings; a wrong or missing term changes
// the norm at O(1)).
constexpr double kModelLossRelative = 1e-2;
constexpr double kModelGradientNormRelative = 5e-2;

std::vector<float> bf16_rounded(std::vector<float> values) {
  for (float& value : values) value = round_to_bf16(value);
  return values;
}

double max_abs(const std::vector<float>& values) {
  double largest = 0.0;
  for (float value : values) largest = std::max(largest, double{std::fabs(value)});
  return largest;
}

Tolerance bf16_gemm_tolerance(const std::vector<float>& ref) {
  return Tolerance{kBf16GemmScaledAtol * max_abs(ref), kBf16GemmRtol};
}

class CudaOpsBf16Test : public gpu_test::CudaOpsFixture {
 protected:
  CudaOpsBf16Test() : CudaOpsFixture(Precision::bf16) {}

  // A bf16 activation buffer holding `values` (which should already be bf16 values).
  float* activation(const std::vector<float>& values) {
    return upload(values, MemoryKind::activations);
  }
  float* poisoned_activation(size_t elems) { return poisoned(elems, MemoryKind::activations); }
  // The check, printing how much of the bound the worst element used.
  void expect_close(const std::string& what, const float* device, const std::vector<float>& ref,
                    Tolerance tolerance) {
    const auto result = all_close(what, download(device, ref.size()), ref, tolerance);
    EXPECT_TRUE(result);
    if (result) std::cout << "  " << what << ": worst error/bound " << result.message() << "\n";
  }
};

class CudaOpsBf16Shapes : public CudaOpsBf16Test, public ::testing::WithParamInterface<OpShape> {};

// ---- memory rules -------------------------------------------------------------------

TEST_F(CudaOpsBf16Test, StorageSizesAndConversions) {
  EXPECT_THROW(CudaOps(0, Precision::fp16), UsageError);
  EXPECT_EQ(gpu_->precision(), Precision::bf16);
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
      << "the parameters' bf16 copy is counted with them";
  gpu_->release(params);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::parameters), params_before);

  // copy_from_host rounds to nearest even; copy_to_host widens exactly.
  const auto rounded = bf16_rounded(values);
  EXPECT_TRUE(all_close("bf16 round trip", download(activations, 1000), rounded, kBitExact));
  // Device copies convert in both directions, and between bf16 buffers they are copies.
  float* other_activations = poisoned_activation(1000);
  gpu_->copy(other_activations, gradients, 1000);
  EXPECT_TRUE(all_close("fp32 -> bf16 copy", download(other_activations, 1000), rounded, kBitExact));
  float* widened = poisoned(1000);
  gpu_->copy(widened, activations, 1000);
  EXPECT_TRUE(all_close("bf16 -> fp32 copy", download(widened, 1000), rounded, kBitExact));
  gpu_->fill_zero(other_activations, 999);
  gpu_->copy(activations, other_activations, 1000);
  std::vector<float> zeroed(1000, 0.0f);
  zeroed[999] = rounded[999];
  EXPECT_TRUE(all_close("fill_zero then bf16 copy", download(activations, 1000), zeroed, kBitExact));
  double magnitude = 0.0;
  for (float value : rounded) magnitude += std::fabs(value);
  EXPECT_TRUE(all_close("sum of bf16", std::vector<double>{gpu_->sum(other_activations, 1000)},
                        std::vector<double>{cpu_.sum(zeroed.data(), 1000)},
                        Tolerance{kDoubleSumRelative * magnitude, 0.0}));
}

// GEMMs read the parameters' bf16 copy at the weight's offset: NaN until
// parameters_changed fills it, and then exactly the ranges it is told about.
TEST_F(CudaOpsBf16Test, GemmsReadTheRefreshedParameterCopy) {
  const int N = 16, IC = 32, OC = 24;
  const size_t weight_at = 8, bias_at = weight_at + size_t(OC) * IC, param_elems = bias_at + OC;
  auto params = bf16_rounded(random_floats(param_elems, 2));
  float* d_params = upload(params, MemoryKind::parameters);
  const auto inp = bf16_rounded(random_floats(size_t(N) * IC, 3));
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
      << "before parameters_changed the bf16 copy must be NaN";
  gpu_->parameters_changed(d_params, 0, param_elems);
  forward();
  expect_close("matmul after parameters_changed", d_out, out, bf16_gemm_tolerance(out));

  // New values everywhere, but only the first half of the weight rows announced: the
  // GEMM must use new rows [0, OC/2) and old rows after.
  const auto fresh = bf16_rounded(random_floats(param_elems, 4));
  gpu_->copy_from_host(d_params, fresh.data(), param_elems);
  const size_t announced_end = weight_at + size_t(OC / 2) * IC;
  gpu_->parameters_changed(d_params + weight_at, 0, announced_end - weight_at);
  std::copy(fresh.begin() + weight_at, fresh.begin() + announced_end, params.begin() + weight_at);
  std::copy(fresh.begin() + bias_at, fresh.end(), params.begin() + bias_at);  // fp32 masters
  forward();
  expect_close("matmul after a partial refresh", d_out, out, bf16_gemm_tolerance(out));
}

// ---- per-op comparisons -------------------------------------------------------------

TEST_P(CudaOpsBf16Shapes, Embedding) {
  const OpShape s = GetParam();
  const size_t N = s.rows(), C = s.channels;
  const auto tokens = random_ids(N, 10, s.vocab);
  const auto wte = random_floats(s.vocab * C, 11), wpe = random_floats(s.seq * C, 12);
  std::vector<float> out(N * C);
  float* d_out = poisoned_activation(out.size());
  const int32_t* d_tokens = upload(tokens);
  cpu_.embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), s.batch, s.seq, s.channels);
  gpu_->embedding_forward(d_out, d_tokens, upload(wte), upload(wpe), s.batch, s.seq, s.channels);
  expect_close("embedding out", d_out, bf16_rounded(out), kBitExact);

  const auto dout = bf16_rounded(random_floats(N * C, 13));
  auto dwte = random_floats(wte.size(), 14), dwpe = random_floats(wpe.size(), 15);
  float *d_dwte = upload(dwte), *d_dwpe = upload(dwpe);
  cpu_.embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.batch, s.seq, s.channels);
  gpu_->embedding_backward(d_dwte, d_dwpe, activation(dout), d_tokens, s.batch, s.seq, s.channels);
  expect_close("dwte (repeated tokens)", d_dwte, dwte, kBitExact);
  expect_close("dwpe", d_dwpe, dwpe, kBitExact);
}

TEST_P(CudaOpsBf16Shapes, LayerNorm) {
  const OpShape s = GetParam();
  const int N = s.rows(), C = s.channels;
  const auto inp = bf16_rounded(random_floats(size_t(N) * C, 20, -3.0f, 5.0f));
  const auto weight = random_floats(C, 21, 0.5f, 1.5f), bias = random_floats(C, 22);
  std::vector<float> out(inp.size()), mean(N), rstd(N);
  float *d_out = poisoned_activation(out.size()), *d_mean = poisoned(N), *d_rstd = poisoned(N);
  const float *d_inp = activation(inp), *d_weight = upload(weight);
  cpu_.layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  gpu_->layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_weight, upload(bias), N, C);
  expect_close("layernorm out", d_out, out, kBf16Rounding);
  expect_close("layernorm mean", d_mean, mean, kRowStatistics);
  expect_close("layernorm rstd", d_rstd, rstd, kRowStatistics);

  const auto dout = bf16_rounded(random_floats(inp.size(), 23));
  auto dinp = bf16_rounded(random_floats(inp.size(), 24));
  auto dweight = random_floats(C, 25), dbias = random_floats(C, 26);
  float *d_dinp = activation(dinp), *d_dweight = upload(dweight), *d_dbias = upload(dbias);
  cpu_.layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                          weight.data(), mean.data(), rstd.data(), N, C);
  gpu_->layernorm_backward(d_dinp, d_dweight, d_dbias, activation(dout), d_inp, d_weight,
                           upload(mean), upload(rstd), N, C);
  expect_close("layernorm dinp", d_dinp, dinp, kBf16Rounding);
  expect_close("layernorm dweight", d_dweight, dweight, kColumnSum);
  expect_close("layernorm dbias", d_dbias, dbias, kColumnSum);
}

TEST_P(CudaOpsBf16Shapes, Matmul) {
  const OpShape s = GetParam();
  const int N = s.rows(), C = s.channels;
  struct Case {
    int in_channels, out_channels;
    bool bias;
  };
  for (const Case& c : {Case{C, 3 * C, true}, Case{4 * C, C, true}, Case{C, s.vocab, false}}) {
    const std::string label = " (" + std::to_string(c.in_channels) + "->" +
                              std::to_string(c.out_channels) + (c.bias ? ", bias)" : ", no bias)");
    // The weight sits 8 elements into the parameters (as the model's weights sit at
    // offsets), the bias after it; both are fp32 masters of bf16 values.
    const size_t weight_elems = size_t(c.out_channels) * c.in_channels;
    const size_t weight_at = 8, bias_at = weight_at + weight_elems;
    const auto params = bf16_rounded(random_floats(bias_at + c.out_channels, 31));
    float* d_params = upload(params, MemoryKind::parameters);
    gpu_->parameters_changed(d_params, 0, params.size());
    const float* weight = params.data() + weight_at;
    const float* bias = c.bias ? params.data() + bias_at : nullptr;
    const float* d_bias = c.bias ? d_params + bias_at : nullptr;

    const auto inp = bf16_rounded(random_floats(size_t(N) * c.in_channels, 30));
    std::vector<float> out(size_t(N) * c.out_channels);
    float* d_out = poisoned_activation(out.size());
    const float* d_inp = activation(inp);
    cpu_.matmul_forward(out.data(), inp.data(), weight, bias, N, c.in_channels, c.out_channels);
    gpu_->matmul_forward(d_out, d_inp, d_params + weight_at, d_bias, N, c.in_channels, c.out_channels);
    expect_close("matmul out" + label, d_out, out, bf16_gemm_tolerance(out));

    const auto dout = bf16_rounded(random_floats(out.size(), 33));
    auto dinp = bf16_rounded(random_floats(inp.size(), 34));
    auto dweight = random_floats(weight_elems, 35), dbias = random_floats(c.out_channels, 36);
    float *d_dinp = activation(dinp), *d_dweight = upload(dweight), *d_dbias = upload(dbias);
    cpu_.matmul_backward(dinp.data(), dweight.data(), c.bias ? dbias.data() : nullptr, dout.data(),
                         inp.data(), weight, N, c.in_channels, c.out_channels);
    gpu_->matmul_backward(d_dinp, d_dweight, c.bias ? d_dbias : nullptr, activation(dout), d_inp,
                          d_params + weight_at, N, c.in_channels, c.out_channels);
    expect_close("matmul dinp" + label, d_dinp, dinp, bf16_gemm_tolerance(dinp));
    expect_close("matmul dweight" + label, d_dweight, dweight, kFp32DotProduct);
    expect_close("matmul dbias" + label, d_dbias, dbias, kColumnSum);
  }
}

TEST_P(CudaOpsBf16Shapes, Attention) {
  const OpShape s = GetParam();
  const size_t N = s.rows(), C = s.channels, T = s.seq;
  const size_t probs_elems = size_t(s.batch) * s.heads * T * T;
  for (bool causal : {true, false}) {
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    const AttentionShape shape{s.batch, s.seq, s.channels, s.heads, causal};
    const auto qkv = bf16_rounded(random_floats(N * 3 * C, 40));
    std::vector<float> out(N * C), probs(probs_elems);
    float *d_out = poisoned_activation(out.size()), *d_probs = poisoned_activation(probs_elems);
    const float* d_qkv = activation(qkv);
    cpu_.attention_forward(out.data(), probs.data(), qkv.data(), shape);
    gpu_->attention_forward(d_out, d_probs, d_qkv, shape);
    expect_close("attention out" + label, d_out, out, kBf16AttentionOut);
    expect_close("attention probs" + label, d_probs, probs, kBf16Probability);
    if (causal) {
      const auto gpu_probs = download(d_probs, probs_elems);
      size_t unmasked = 0;
      for (size_t row = 0; row < probs_elems / T; ++row)
        for (size_t t2 = row % T + 1; t2 < T; ++t2) unmasked += gpu_probs[row * T + t2] != 0.0f;
      EXPECT_EQ(unmasked, 0u) << "masked probabilities must be exact zeros";
    }

    // Both sides take the bf16 rounding of the CPU's probabilities.
    const auto probs_rounded = bf16_rounded(probs);
    const auto dout = bf16_rounded(random_floats(N * C, 41));
    auto dqkv = bf16_rounded(random_floats(qkv.size(), 42));
    float* d_dqkv = activation(dqkv);
    cpu_.attention_backward(dqkv.data(), dout.data(), qkv.data(), probs_rounded.data(), shape);
    gpu_->attention_backward(d_dqkv, activation(dout), d_qkv, activation(probs_rounded), shape);
    expect_close("attention dqkv" + label, d_dqkv, dqkv, bf16_gemm_tolerance(dqkv));
  }
}

TEST_P(CudaOpsBf16Shapes, Gelu) {
  const OpShape s = GetParam();
  const size_t elems = size_t(s.rows()) * 4 * s.channels + 5;  // +5: a ragged tail
  const auto inp = bf16_rounded(random_floats(elems, 50, -5.0f, 5.0f));
  std::vector<float> out(elems);
  float* d_out = poisoned_activation(elems);
  const float* d_inp = activation(inp);
  cpu_.gelu_forward(out.data(), inp.data(), elems);
  gpu_->gelu_forward(d_out, d_inp, elems);
  expect_close("gelu out", d_out, out, kBf16Rounding);
  const auto dout = bf16_rounded(random_floats(elems, 51));
  auto dinp = bf16_rounded(random_floats(elems, 52));
  float* d_dinp = activation(dinp);
  cpu_.gelu_backward(dinp.data(), inp.data(), dout.data(), elems);
  gpu_->gelu_backward(d_dinp, d_inp, activation(dout), elems);
  expect_close("gelu dinp", d_dinp, dinp, kBf16GeluBackward);
}

TEST_P(CudaOpsBf16Shapes, ResidualAndAccumulate) {
  const OpShape s = GetParam();
  const size_t elems = size_t(s.rows()) * s.channels + 3;  // +3: a ragged tail
  const auto a = bf16_rounded(random_floats(elems, 60)), b = bf16_rounded(random_floats(elems, 61));
  std::vector<float> out(elems);
  float* d_out = poisoned_activation(elems);
  const float *d_a = activation(a), *d_b = activation(b);
  cpu_.residual_forward(out.data(), a.data(), b.data(), elems);
  gpu_->residual_forward(d_out, d_a, d_b, elems);
  out = bf16_rounded(out);
  expect_close("residual out", d_out, out, kBitExact);
  cpu_.accumulate(out.data(), b.data(), elems);
  gpu_->accumulate(d_out, d_b, elems);
  expect_close("accumulate", d_out, bf16_rounded(out), kBitExact);
}

TEST_P(CudaOpsBf16Shapes, SoftmaxCrossEntropy) {
  const OpShape s = GetParam();
  const int N = s.rows(), V = s.vocab;
  const auto logits = bf16_rounded(random_floats(size_t(N) * V, 70, -6.0f, 6.0f));
  const auto targets = random_ids(N, 71, V);
  std::vector<float> losses(N), probs(logits.size());
  float* d_losses = gpu_->allocate_statistics(N);
  owned_.push_back(d_losses);
  float* d_probs = poisoned_activation(probs.size());
  const int32_t* d_targets = upload(targets);
  cpu_.softmax_cross_entropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  gpu_->softmax_cross_entropy_forward(d_losses, d_probs, activation(logits), d_targets, N, V);
  expect_close("cross-entropy losses", d_losses, losses, kSoftmax);
  expect_close("cross-entropy probs", d_probs, probs, kBf16Probability);

  const float loss_scale = 1.0f / static_cast<float>(N);
  const auto probs_rounded = bf16_rounded(probs);
  auto dlogits = bf16_rounded(random_floats(logits.size(), 72));
  float* d_dlogits = activation(dlogits);
  cpu_.softmax_cross_entropy_backward(dlogits.data(), probs_rounded.data(), targets.data(), N, V,
                                      loss_scale);
  gpu_->softmax_cross_entropy_backward(d_dlogits, activation(probs_rounded), d_targets, N, V,
                                       loss_scale);
  expect_close("cross-entropy dlogits", d_dlogits, bf16_rounded(dlogits), kBitExact);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsBf16Shapes, ::testing::ValuesIn(kShapes),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- a whole model step -------------------------------------------------------------

TEST_F(CudaOpsBf16Test, WholeModelLossAndGradientsMatchTheFp32Cpu) {
  for (bool causal : {true, false}) {
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    const ModelShape shape{2, 64, 4, 101, 32, causal};
    const int batch = 3, seq = 17;
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
    EXPECT_LE(loss_error, kModelLossRelative) << "loss" << label << ": gpu " << gpu_loss
                                              << ", cpu " << cpu_loss;
    std::cout << "  loss" << label << ": cpu " << cpu_loss << ", bf16 gpu " << gpu_loss
              << ", relative error " << loss_error << "\n";

    const float loss_scale = 1.0f / static_cast<float>(batch * seq);
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
      EXPECT_LE(relative, kModelGradientNormRelative) << "gradient of " << tensor.name << label;
      if (relative > worst) {
        worst = relative;
        worst_name = tensor.name;
      }
    }
    std::cout << "  gradients" << label << ": worst norm-wise relative error " << worst << " ("
              << worst_name << ")\n";

    // Deterministic in bf16 too: the same step gives the same bits.
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
// bf16 and fp32, and the bf16 ops one by one.
TEST_F(CudaOpsBf16Test, Gpt2SmallTimings) {
  const char* enabled = std::getenv("SCALESTUDY_GPU_TIMING");
  if (enabled == nullptr || std::string(enabled) != "1")
    GTEST_SKIP() << "set SCALESTUDY_GPU_TIMING=1 to time GPT-2 small";
  const ModelShape shape{12, 768, 12, 50257, 1024, true};
  const int B = 8, T = 1024, N = B * T, C = 768, V = 50257;
  const auto inputs = random_ids(size_t(N), 100, V), targets = random_ids(size_t(N), 101, V);
  const float loss_scale = 1.0f / static_cast<float>(N);
  for (Precision precision : {Precision::bf16, Precision::fp32}) {
    CudaOps ops(0, precision);
    const ParameterLayout layout = make_parameter_layout(shape);
    Gpt model(ops, shape, B, T, layout.param_elems);
    model.initialize(1);
    ops.parameters_changed(model.params(), 0, layout.param_elems);
    float* grads = ops.allocate_floats(layout.param_elems, MemoryKind::gradients);
    ops.fill_zero(grads, layout.param_elems);
    FullGradient sink(layout, grads);
    const char* name = precision == Precision::bf16 ? "bf16" : "fp32";
    std::cout << "  " << name << " forward";
    const double forward_ms =
        median_ms(ops, 1, [&] { model.forward(inputs.data(), targets.data(), nullptr); });
    std::cout << "\n  " << name << " forward+backward";
    const double step_ms = median_ms(ops, 1, [&] {
      model.forward(inputs.data(), targets.data(), nullptr);
      model.backward(sink, loss_scale);
    });
    // A whole ddp step on one GPU: zeroed gradients, the gradient norm, AdamW, and the
    // refresh of the parameters' bf16 copy.
    float* m = ops.allocate_floats(layout.param_elems, MemoryKind::optimizer);
    float* v = ops.allocate_floats(layout.param_elems, MemoryKind::optimizer);
    ops.fill_zero(m, layout.param_elems);
    ops.fill_zero(v, layout.param_elems);
    AdamWParams hyper;
    hyper.learning_rate = 1e-4f;
    std::cout << "\n  " << name << " full step";
    const double full_ms = median_ms(ops, 1, [&] {
      ops.fill_zero(grads, layout.param_elems);
      model.forward(inputs.data(), targets.data(), nullptr);
      model.backward(sink, loss_scale);
      (void)ops.sum_of_squares(grads, layout.param_elems);
      ops.adamw_update(model.params(), grads, m, v, layout.param_elems, hyper);
      ops.parameters_changed(model.params(), 0, layout.param_elems);
    });
    std::cout << "\n  " << name << ": forward " << forward_ms << " ms, forward+backward " << step_ms
              << " ms = " << N / (step_ms * 1e-3) << " tokens/s; full step " << full_ms
              << " ms = " << N / (full_ms * 1e-3) << " tokens/s (loss " << model.mean_loss()
              << ")\n";
    ops.release(m);
    ops.release(v);
    ops.release(grads);
  }

  // The bf16 ops at GPT-2 small shapes.
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
  float *logits = act(size_t(N) * V), *dlogits = act(size_t(N) * V), *vocab_probs = act(size_t(N) * V);
  float *stats = ops.allocate_statistics(2 * size_t(N)), *losses = ops.allocate_statistics(N);
  owned_.push_back(stats);
  owned_.push_back(losses);
  int32_t* d_targets = ops.allocate_ints(N, MemoryKind::activations);
  owned_.push_back(d_targets);
  ops.copy_ints_from_host(d_targets, targets.data(), N);
  const AttentionShape att{B, T, C, 12, true};
  struct Timed {
    const char* name;
    int reps;
    std::function<void()> work;
  };
  const std::vector<Timed> timed = {
      {"matmul fwd 768->2304", 10, [&] { ops.matmul_forward(qkv, x, params, params + 1, N, C, 3 * C); }},
      {"matmul bwd 768->2304", 10, [&] { ops.matmul_backward(x, grads, grads + 1, qkv, x, params, N, C, 3 * C); }},
      {"matmul fwd 768->3072", 10, [&] { ops.matmul_forward(wide, x, params, params + 1, N, C, 4 * C); }},
      {"matmul bwd 768->3072", 10, [&] { ops.matmul_backward(x, grads, grads + 1, wide, x, params, N, C, 4 * C); }},
      {"matmul fwd 3072->768", 10, [&] { ops.matmul_forward(x, wide, params, params + 1, N, 4 * C, C); }},
      {"matmul bwd 3072->768", 10, [&] { ops.matmul_backward(wide, grads, grads + 1, x, wide, params, N, 4 * C, C); }},
      {"matmul fwd 768->768", 10, [&] { ops.matmul_forward(y, x, params, params + 1, N, C, C); }},
      {"matmul fwd LM head", 3, [&] { ops.matmul_forward(logits, x, params, nullptr, N, C, V); }},
      {"matmul bwd LM head", 3, [&] { ops.matmul_backward(x, grads, nullptr, dlogits, x, params, N, C, V); }},
      {"attention fwd", 5, [&] { ops.attention_forward(y, probs, qkv, att); }},
      {"attention bwd", 5, [&] { ops.attention_backward(dqkv, y, qkv, probs, att); }},
      {"layernorm fwd", 10, [&] { ops.layernorm_forward(y, stats, stats + N, x, params, params, N, C); }},
      {"layernorm bwd", 10, [&] { ops.layernorm_backward(x, grads, grads + C, y, x, params, stats, stats + N, N, C); }},
      {"gelu fwd", 10, [&] { ops.gelu_forward(wide2, wide, 4 * NC); }},
      {"gelu bwd", 10, [&] { ops.gelu_backward(wide2, wide, wide, 4 * NC); }},
      {"residual fwd", 10, [&] { ops.residual_forward(y, x, y, NC); }},
      {"fill_zero 4NC", 10, [&] { ops.fill_zero(wide, 4 * NC); }},
      {"cross-entropy fwd", 3, [&] { ops.softmax_cross_entropy_forward(losses, vocab_probs, logits, d_targets, N, V); }},
      {"cross-entropy bwd", 3, [&] { ops.softmax_cross_entropy_backward(dlogits, vocab_probs, d_targets, N, V, loss_scale); }},
      {"fill_zero dlogits", 3, [&] { ops.fill_zero(dlogits, size_t(N) * V); }},
      {"parameters_changed 38.6M (wte + 4C)", 3, [&] { ops.parameters_changed(params, 0, param_elems); }},
  };
  for (const Timed& t : timed) {
    std::cout << "  bf16 " << t.name;
    const double ms = median_ms(ops, t.reps, t.work);
    std::cout << ": " << ms << " ms\n";
  }

  // The LM head's rows are V = 50257 bf16 long, not a multiple of 16 bytes; the same three
  // GEMMs with rows padded to a multiple of 8 show what that alignment costs.
  const int padded_vocab = (V + 7) / 8 * 8;
  float* padded = act(size_t(N) * padded_vocab);
  const float one = 1.0f, zero = 0.0f;
  const cublasHandle_t handle = ops.cublas_handle();
  const auto* weight = reinterpret_cast<const __nv_bfloat16*>(vocab_probs);
  for (int ld : {V, padded_vocab}) {
    auto* head_out = reinterpret_cast<__nv_bfloat16*>(ld == V ? logits : padded);
    auto* lnf = reinterpret_cast<__nv_bfloat16*>(x);
    auto* dlnf = reinterpret_cast<__nv_bfloat16*>(y);
    const std::string label = " (ld " + std::to_string(ld) + ")";
    std::cout << "  raw GEMM LM head fwd" << label;
    std::cout << ": " << median_ms(ops, 3, [&] {
      cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, &one, weight, CUDA_R_16BF, C, lnf,
                   CUDA_R_16BF, C, &zero, head_out, CUDA_R_16BF, ld, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    }) << " ms\n";
    std::cout << "  raw GEMM LM head dinp" << label;
    std::cout << ": " << median_ms(ops, 3, [&] {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, &one, weight, CUDA_R_16BF, C,
                   head_out, CUDA_R_16BF, ld, &one, dlnf, CUDA_R_16BF, C, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    }) << " ms\n";
    std::cout << "  raw GEMM LM head dweight" << label;
    std::cout << ": " << median_ms(ops, 3, [&] {
      cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, &one, lnf, CUDA_R_16BF, C,
                   head_out, CUDA_R_16BF, ld, &one, grads, CUDA_R_32F, C, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
    }) << " ms\n";
  }
}

}  // namespace
}  // namespace scalestudy
