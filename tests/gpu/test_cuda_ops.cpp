// Every op of the CUDA backend against the CPU reference (the oracle), on identical
// inputs, and a whole model step on both backends.
//
// Each check is |gpu - cpu| <= atol + rtol*|cpu|, with the tolerance named per op below
// and the first mismatch printed. Outputs that an op overwrites are NaN-poisoned on the
// GPU first, so an element the GPU never writes fails; gradient outputs start from the
// same random "prior" on both sides, so a GPU backward that overwrites instead of
// accumulating fails too. Inputs are random with fixed seeds and never all zero.
//
// The shapes are a medium one, an odd one (T=33, C=96, V=517: no dimension a multiple
// of a tile or warp) and a tiny one (head size 3), to catch tail handling.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "cuda_test_support.h"

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

// ---- tolerances, fp32 ---------------------------------------------------------------
// Measured on an H100 (sm_90, CUDA 13.0): every check stayed within 0.41 of its bound,
// the closest being the LM head's dinp (1000-term dot products) under kDotProduct.
// Bit-identical: ops whose per-element arithmetic is the same sequence of IEEE fp32
// operations on both backends (the CUDA kernels use non-fusing __f*_rn intrinsics, and
// sums run in the CPU's order): embedding, residual, accumulate, scale, fill, the
// cross-entropy backward and AdamW.
constexpr Tolerance kBitExact{0.0, 0.0};
// LayerNorm forward and its input gradient: row statistics in double on both sides,
// summed in different orders (differences ~1e-16 that can flip the last bit of the fp32
// mean or rstd), then identical per-element arithmetic: a few fp32 ulps of O(1) values.
constexpr Tolerance kRowStatistics{1e-6, 1e-6};
// Column sums over N <= 128 rows (LayerNorm dweight/dbias, matmul dbias): the CPU adds
// the rows one by one in fp32, whose rounding error grows like sqrt(N)*2^-24*|partial
// sums| ~ 1e-5 at most for O(1) terms; the GPU's chunked sums are more accurate still.
constexpr Tolerance kColumnSum{5e-5, 1e-5};
// Dot products of up to 1000 O(1) terms (matmul, attention; the LM head's dinp sums over
// V) in different orders: the CPU with 8 lanes, cuBLAS with its own tiling and fused
// multiply-adds. Each side's error is ~sqrt(K)*2^-24*|partial sums| <~ 2e-5 for results
// of ~10; a wrong index or a lost accumulation is O(1).
constexpr Tolerance kDotProduct{5e-5, 1e-5};
// Softmax outputs (attention probabilities, cross-entropy probabilities and loss): expf
// on the GPU is within 2 ulp of glibc's, sums are in double: a few ulps relative.
constexpr Tolerance kSoftmax{1e-7, 2e-6};
// GELU: tanhf within 2 ulp of glibc's. Forward: 0.5*x*(1+tanh) moves by ~|x|*1e-7. The
// backward's 1 - tanh^2 cancels as |tanh| -> 1, so its absolute error is scaled by
// 0.5*|x|*dinner ~ 10 at |x| = 5.
constexpr Tolerance kGeluForward{1e-6, 1e-6};
constexpr Tolerance kGeluBackward{5e-6, 1e-6};
// Whole-buffer sums in double, in different orders: relative to sum|x|, each side is
// within n*2^-53 ~ 1e-10 of exact; the check uses atol = kDoubleSumRelative*sum|x|.
constexpr double kDoubleSumRelative = 1e-11;
// Whole model (2 layers, GPT-2 initialisation), loss and every gradient: the per-op
// differences above pass through ~20 ops. Gradients are compared per tensor with atol
// scaled by the tensor's largest |gradient|, since elements near zero carry no relative
// accuracy. On an H100 the largest differences were ~1e-9 relative on the loss and
// ~5e-7 of max|gradient|, so both bounds leave a margin of ~40x or more, while a wrong
// term changes gradients at O(1) of that scale.
constexpr Tolerance kModelLoss{1e-7, 1e-6};
constexpr Tolerance kModelGradient{2e-5 /* times max|grad| of the tensor */, 1e-4};

// ---- fixture ------------------------------------------------------------------------

// The backend in fp32 mode, named explicitly: these tests are what "fp32 is unchanged"
// means.
class CudaOpsTest : public gpu_test::CudaOpsFixture {
 protected:
  CudaOpsTest() : CudaOpsFixture(Precision::fp32) {}

  // LayerNorm forward and backward, both ways of writing dinp, against the CPU at one
  // [rows, channels] shape.
  void check_layernorm(int N, int C, const std::string& shape_label) {
    const auto inp = random_floats(size_t(N) * C, 20, -3.0f, 5.0f);
    const auto weight = random_floats(C, 21, 0.5f, 1.5f), bias = random_floats(C, 22);
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    float *d_out = poisoned(out.size()), *d_mean = poisoned(N), *d_rstd = poisoned(N);
    const float *d_inp = upload(inp), *d_weight = upload(weight);
    cpu_.layernorm_forward({.out = out.data(), .mean = mean.data(), .rstd = rstd.data(),
                            .inp = inp.data(), .weight = weight.data(), .bias = bias.data(),
                            .rows = N, .channels = C});
    gpu_->layernorm_forward({.out = d_out, .mean = d_mean, .rstd = d_rstd, .inp = d_inp,
                             .weight = d_weight, .bias = upload(bias), .rows = N, .channels = C});
    EXPECT_TRUE(matches("layernorm out" + shape_label, d_out, out, kRowStatistics));
    EXPECT_TRUE(matches("layernorm mean" + shape_label, d_mean, mean, kRowStatistics));
    EXPECT_TRUE(matches("layernorm rstd" + shape_label, d_rstd, rstd, kRowStatistics));

    // The residual add before it, in the same op: bit for bit the two ops in turn.
    const auto addend = random_floats(inp.size(), 23, -1.0f, 1.0f);
    const float* d_addend = upload(addend);
    float *d_sum = poisoned(inp.size()), *d_fused_out = poisoned(out.size());
    float *d_fused_mean = poisoned(N), *d_fused_rstd = poisoned(N);
    gpu_->residual_layernorm_forward({.residual = d_sum, .out = d_fused_out, .mean = d_fused_mean,
                                      .rstd = d_fused_rstd, .a = d_inp, .b = d_addend,
                                      .weight = d_weight, .bias = upload(bias), .rows = N,
                                      .channels = C});
    float* d_plain_sum = poisoned(inp.size());
    gpu_->residual_forward(d_plain_sum, d_inp, d_addend, inp.size());
    gpu_->layernorm_forward({.out = d_out, .mean = d_mean, .rstd = d_rstd, .inp = d_plain_sum,
                             .weight = d_weight, .bias = upload(bias), .rows = N, .channels = C});
    EXPECT_TRUE(matches("residual + layernorm sum" + shape_label, d_sum, download(d_plain_sum, inp.size()),
                        kBitExact));
    EXPECT_TRUE(matches("residual + layernorm out" + shape_label, d_fused_out, download(d_out, out.size()),
                        kBitExact));
    EXPECT_TRUE(matches("residual + layernorm mean" + shape_label, d_fused_mean, download(d_mean, N),
                        kBitExact));
    EXPECT_TRUE(matches("residual + layernorm rstd" + shape_label, d_fused_rstd, download(d_rstd, N),
                        kBitExact));

    // The backward reads the CPU's mean and rstd on both sides: one op at a time.
    const auto dout = random_floats(inp.size(), 23);
    for (GradientWrite write : kGradientWrites) {
      const std::string label = shape_label + write_label(write);
      auto dinp = random_floats(inp.size(), 24), dweight = random_floats(C, 25), dbias = random_floats(C, 26);
      float* d_dinp = write == GradientWrite::accumulate ? upload(dinp) : poisoned(dinp.size());
      float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
      cpu_.layernorm_backward({.dinp = dinp.data(), .dweight = dweight.data(),
                               .dbias = dbias.data(), .dout = dout.data(), .inp = inp.data(),
                               .weight = weight.data(), .mean = mean.data(), .rstd = rstd.data(),
                               .rows = N, .channels = C, .dinp_write = write});
      gpu_->layernorm_backward({.dinp = d_dinp, .dweight = d_dweight, .dbias = d_dbias,
                                .dout = upload(dout), .inp = d_inp, .weight = d_weight,
                                .mean = upload(mean), .rstd = upload(rstd), .rows = N,
                                .channels = C, .dinp_write = write});
      EXPECT_TRUE(matches("layernorm dinp" + label, d_dinp, dinp, kRowStatistics));
      EXPECT_TRUE(matches("layernorm dweight" + label, d_dweight, dweight, kColumnSum));
      EXPECT_TRUE(matches("layernorm dbias" + label, d_dbias, dbias, kColumnSum));
    }
  }

  // The cross-entropy forward and backward (out of place and in place) against the CPU
  // on [N, V] logits.
  void check_cross_entropy(int N, int V, const std::string& label) {
    const auto logits = random_floats(size_t(N) * V, 70, -6.0f, 6.0f);
    const auto targets = random_ids(N, 71, V);
    std::vector<float> losses(N), row_stats(2 * size_t(N));
    float *d_losses = poisoned(N), *d_stats = poisoned(row_stats.size());
    float* d_logits = upload(logits);
    const int32_t* d_targets = upload(targets);
    cpu_.softmax_cross_entropy_forward(losses.data(), row_stats.data(), logits.data(), targets.data(), N, V);
    gpu_->softmax_cross_entropy_forward(d_losses, d_stats, d_logits, d_targets, N, V);
    EXPECT_TRUE(matches("cross-entropy losses" + label, d_losses, losses, kSoftmax));
    EXPECT_TRUE(matches("cross-entropy row max and 1/sum" + label, d_stats, row_stats, kSoftmax));

    // The backward overwrites (the poison must go) and recomputes the softmax with expf.
    const float loss_scale = 1.0f / static_cast<float>(N);
    std::vector<float> dlogits(logits.size());
    float* d_dlogits = poisoned(logits.size());
    cpu_.softmax_cross_entropy_backward(dlogits.data(), logits.data(), row_stats.data(), targets.data(), N, V,
                                        loss_scale);
    gpu_->softmax_cross_entropy_backward(d_dlogits, d_logits, upload(row_stats), d_targets, N, V, loss_scale);
    EXPECT_TRUE(matches("cross-entropy dlogits" + label, d_dlogits, dlogits, kSoftmax));
    // In place, as the classifier runs it: the very same bits.
    gpu_->softmax_cross_entropy_backward(d_logits, d_logits, upload(row_stats), d_targets, N, V, loss_scale);
    EXPECT_TRUE(matches("cross-entropy dlogits in place" + label, d_logits, download(d_dlogits, logits.size()),
                        kBitExact));
  }
};

class CudaOpsShapes : public CudaOpsTest, public ::testing::WithParamInterface<OpShape> {};

// ---- memory -------------------------------------------------------------------------

TEST_F(CudaOpsTest, MemoryAccountingCopiesAndHostBufferReuse) {
  std::cout << "device: " << cuda_device_description(0) << "\n";
  EXPECT_EQ(gpu_->name(), "cuda");
  const size_t params_before = gpu_->allocated_bytes(MemoryKind::parameters);
  float* params = gpu_->allocate_floats(1000, MemoryKind::parameters);
  int32_t* tokens = gpu_->allocate_ints(7, MemoryKind::activations);
  float* empty = gpu_->allocate_floats(0, MemoryKind::gradients);
  ASSERT_NE(params, nullptr);
  ASSERT_NE(empty, nullptr) << "a zero-element allocation still returns a real pointer";
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::parameters), params_before + 1000 * sizeof(float));
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::activations), 7 * sizeof(int32_t));
  EXPECT_EQ(gpu_->peak_source(), "cudaMemGetInfo");
  EXPECT_GE(gpu_->measured_peak_bytes(), gpu_->allocated_bytes(MemoryKind::parameters));

  // The host buffer is overwritten right after copy_from_host returns: the device must
  // still get the first contents.
  std::vector<float> host = random_floats(1000, 1);
  const std::vector<float> first = host;
  gpu_->copy_from_host(params, host.data(), host.size());
  std::fill(host.begin(), host.end(), -1.0f);
  EXPECT_TRUE(all_close("copy_from_host then host reuse", download(params, 1000), first, kBitExact));

  std::vector<int32_t> ids = random_ids(7, 2, 50), ids_back(7, -1);
  gpu_->copy_ints_from_host(tokens, ids.data(), ids.size());
  ASSERT_EQ(cudaMemcpy(ids_back.data(), tokens, 7 * sizeof(int32_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(ids_back, ids);

  // Device copies, disjoint and overlapping in both directions (memmove semantics).
  float* other = poisoned(1000);
  gpu_->copy(other, params, 1000);
  EXPECT_TRUE(all_close("copy", download(other, 1000), first, kBitExact));
  gpu_->copy(other + 10, other, 900);
  std::vector<float> shifted = first;
  std::copy(first.begin(), first.begin() + 900, shifted.begin() + 10);
  EXPECT_TRUE(all_close("overlapping copy forward", download(other, 1000), shifted, kBitExact));
  gpu_->copy(other, other + 10, 900);
  std::copy(shifted.begin() + 10, shifted.begin() + 910, shifted.begin());
  EXPECT_TRUE(all_close("overlapping copy backward", download(other, 1000), shifted, kBitExact));
  gpu_->fill_zero(other, 999);
  std::vector<float> zeroed(1000, 0.0f);
  zeroed[999] = shifted[999];
  EXPECT_TRUE(all_close("fill_zero", download(other, 1000), zeroed, kBitExact));

  gpu_->release(params);
  gpu_->release(tokens);
  gpu_->release(empty);
  gpu_->release(nullptr);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::parameters), params_before);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::activations), 0u);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::gradients), 0u);
}

// The mixed-precision additions to the interface leave fp32 mode as it was: statistics
// are ordinary fp32 activations, activations keep 4 bytes per element, parameters get
// no lower-precision copy, and parameters_changed does nothing.
TEST_F(CudaOpsTest, Fp32ModeKeepsEveryBufferFp32) {
  EXPECT_EQ(gpu_->precision(), Precision::fp32);
  const size_t params_before = gpu_->allocated_bytes(MemoryKind::parameters);
  const auto values = random_floats(100, 3);
  float* params = upload(values, MemoryKind::parameters);
  float* activations = upload(values, MemoryKind::activations);
  float* statistics = gpu_->allocate_statistics(10);
  owned_.push_back(statistics);
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::parameters), params_before + 100 * sizeof(float));
  EXPECT_EQ(gpu_->allocated_bytes(MemoryKind::activations), 110 * sizeof(float));
  gpu_->parameters_changed(params, 0, 100);
  EXPECT_TRUE(all_close("parameters after parameters_changed", download(params, 100), values,
                        kBitExact));
  EXPECT_TRUE(all_close("fp32 activations", download(activations, 100), values, kBitExact));
}

// ---- per-op comparisons -------------------------------------------------------------

TEST_P(CudaOpsShapes, Embedding) {
  const OpShape s = GetParam();
  const size_t N = s.rows(), C = s.channels;
  const auto tokens = random_ids(N, 10, s.vocab);
  const auto wte = random_floats(s.vocab * C, 11), wpe = random_floats(s.seq * C, 12);
  std::vector<float> out(N * C);
  float* d_out = poisoned(out.size());
  const int32_t* d_tokens = upload(tokens);
  cpu_.embedding_forward({.out = out.data(), .tokens = tokens.data(), .wte = wte.data(),
                          .wpe = wpe.data(), .batch = s.batch, .seq = s.seq, .channels = s.channels});
  gpu_->embedding_forward({.out = d_out, .tokens = d_tokens, .wte = upload(wte), .wpe = upload(wpe),
                           .batch = s.batch, .seq = s.seq, .channels = s.channels});
  EXPECT_TRUE(matches("embedding out", d_out, out, kBitExact));

  const auto dout = random_floats(N * C, 13);
  auto dwte = random_floats(wte.size(), 14), dwpe = random_floats(wpe.size(), 15);
  float* d_dwte = upload(dwte);
  float* d_dwpe = upload(dwpe);
  cpu_.embedding_backward({.dwte = dwte.data(), .dwpe = dwpe.data(), .dout = dout.data(),
                           .tokens = tokens.data(), .batch = s.batch, .seq = s.seq,
                           .channels = s.channels});
  gpu_->embedding_backward({.dwte = d_dwte, .dwpe = d_dwpe, .dout = upload(dout),
                            .tokens = d_tokens, .batch = s.batch, .seq = s.seq,
                            .channels = s.channels});
  EXPECT_TRUE(matches("dwte (repeated tokens)", d_dwte, dwte, kBitExact));
  EXPECT_TRUE(matches("dwpe", d_dwpe, dwpe, kBitExact));
}

TEST_P(CudaOpsShapes, LayerNorm) {
  const OpShape s = GetParam();
  check_layernorm(s.rows(), s.channels, "");
}

// In fp32 a row stays in registers up to 1024 channels (8 packs of 4 per lane): GPT-2
// small's and medium's widths take that path, 1032 the block-per-row one. 70 rows leave
// the backward's last chunk of 32 rows partly empty.
TEST_F(CudaOpsTest, LayerNormAtModelWidths) {
  for (int channels : {768, 1024, 1032})
    check_layernorm(70, channels, " (C=" + std::to_string(channels) + ")");
}

TEST_P(CudaOpsShapes, Matmul) {
  const OpShape s = GetParam();
  const int N = s.rows(), C = s.channels;
  struct Case {
    int in_channels, out_channels;
    bool bias;
  };
  // The QKV projection, the MLP's down projection, and the bias-free tied LM head.
  for (const Case& c : {Case{C, 3 * C, true}, Case{4 * C, C, true}, Case{C, s.vocab, false}}) {
    const std::string label = " (" + std::to_string(c.in_channels) + "->" +
                              std::to_string(c.out_channels) + (c.bias ? ", bias)" : ", no bias)");
    const auto inp = random_floats(size_t(N) * c.in_channels, 30);
    const auto weight = random_floats(size_t(c.out_channels) * c.in_channels, 31);
    const auto bias = random_floats(c.out_channels, 32);
    std::vector<float> out(size_t(N) * c.out_channels);
    float* d_out = poisoned(out.size());
    const float *d_inp = upload(inp), *d_weight = upload(weight);
    const float* d_bias = c.bias ? upload(bias) : nullptr;
    cpu_.matmul_forward(out.data(), inp.data(), weight.data(), c.bias ? bias.data() : nullptr, N,
                        c.in_channels, c.out_channels);
    gpu_->matmul_forward(d_out, d_inp, d_weight, d_bias, N, c.in_channels, c.out_channels);
    EXPECT_TRUE(matches("matmul out" + label, d_out, out, kDotProduct));

    const auto dout = random_floats(out.size(), 33);
    for (GradientWrite write : kGradientWrites) {
      const std::string labels = label + write_label(write);
      auto dinp = random_floats(inp.size(), 34), dweight = random_floats(weight.size(), 35);
      auto dbias = random_floats(c.out_channels, 36);
      float* d_dinp = write == GradientWrite::accumulate ? upload(dinp) : poisoned(dinp.size());
      float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
      cpu_.matmul_backward({.dinp = dinp.data(), .dweight = dweight.data(),
                            .dbias = c.bias ? dbias.data() : nullptr, .dout = dout.data(),
                            .inp = inp.data(), .weight = weight.data(), .rows = N,
                            .in_channels = c.in_channels, .out_channels = c.out_channels,
                            .dinp_write = write});
      gpu_->matmul_backward({.dinp = d_dinp, .dweight = d_dweight,
                             .dbias = c.bias ? d_dbias : nullptr, .dout = upload(dout),
                             .inp = d_inp, .weight = d_weight, .rows = N,
                             .in_channels = c.in_channels, .out_channels = c.out_channels,
                             .dinp_write = write});
      EXPECT_TRUE(matches("matmul dinp" + labels, d_dinp, dinp, kDotProduct));
      EXPECT_TRUE(matches("matmul dweight" + labels, d_dweight, dweight, kDotProduct));
      // Without a bias the dbias buffer must be left alone.
      EXPECT_TRUE(matches("matmul dbias" + labels, d_dbias, dbias, kColumnSum));
    }
  }
}

TEST_P(CudaOpsShapes, Attention) {
  const OpShape s = GetParam();
  const size_t N = s.rows(), C = s.channels, T = s.seq;
  const size_t probs_elems = size_t(s.batch) * s.heads * T * T;
  for (bool causal : {true, false}) {
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    const AttentionShape shape{s.batch, s.seq, s.channels, s.heads, causal};
    const auto qkv = random_floats(N * 3 * C, 40);
    std::vector<float> out(N * C), probs(probs_elems);
    float *d_out = poisoned(out.size()), *d_probs = poisoned(probs_elems);
    const float* d_qkv = upload(qkv);
    cpu_.attention_forward(out.data(), probs.data(), qkv.data(), shape);
    gpu_->attention_forward(d_out, d_probs, d_qkv, shape);
    EXPECT_TRUE(matches("attention out" + label, d_out, out, kDotProduct));
    EXPECT_TRUE(matches("attention probs" + label, d_probs, probs, kSoftmax));
    if (causal) {
      const auto gpu_probs = download(d_probs, probs_elems);
      size_t unmasked = 0;
      for (size_t row = 0; row < probs_elems / T; ++row)
        for (size_t t2 = row % T + 1; t2 < T; ++t2) unmasked += gpu_probs[row * T + t2] != 0.0f;
      EXPECT_EQ(unmasked, 0u) << "masked probabilities must be exact zeros";
    }

    const auto dout = random_floats(N * C, 41);
    for (GradientWrite write : kGradientWrites) {
      auto dqkv = random_floats(qkv.size(), 42);
      float* d_dqkv = write == GradientWrite::accumulate ? upload(dqkv) : poisoned(dqkv.size());
      cpu_.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), probs.data(), shape, write);
      gpu_->attention_backward(d_dqkv, upload(dout), d_qkv, d_out, upload(probs), shape, write);
      EXPECT_TRUE(matches("attention dqkv" + label + write_label(write), d_dqkv, dqkv, kDotProduct));
    }
  }
}

TEST_P(CudaOpsShapes, Gelu) {
  const OpShape s = GetParam();
  const size_t elems = size_t(s.rows()) * 4 * s.channels;
  const auto inp = random_floats(elems, 50, -5.0f, 5.0f);
  std::vector<float> out(elems);
  float* d_out = poisoned(elems);
  const float* d_inp = upload(inp);
  cpu_.gelu_forward(out.data(), inp.data(), elems);
  gpu_->gelu_forward(d_out, d_inp, elems);
  EXPECT_TRUE(matches("gelu out", d_out, out, kGeluForward));
  const auto dout = random_floats(elems, 51);
  for (GradientWrite write : kGradientWrites) {
    auto dinp = random_floats(elems, 52);
    float* d_dinp = write == GradientWrite::accumulate ? upload(dinp) : poisoned(elems);
    cpu_.gelu_backward(dinp.data(), inp.data(), dout.data(), elems, write);
    gpu_->gelu_backward(d_dinp, d_inp, upload(dout), elems, write);
    EXPECT_TRUE(matches("gelu dinp" + write_label(write), d_dinp, dinp, kGeluBackward));
  }
}

TEST_P(CudaOpsShapes, ResidualAccumulateScaleFill) {
  const OpShape s = GetParam();
  const size_t elems = size_t(s.rows()) * s.channels + 3;  // +3: a ragged tail
  const auto a = random_floats(elems, 60), b = random_floats(elems, 61);
  std::vector<float> out(elems);
  float* d_out = poisoned(elems);
  const float *d_a = upload(a), *d_b = upload(b);
  cpu_.residual_forward(out.data(), a.data(), b.data(), elems);
  gpu_->residual_forward(d_out, d_a, d_b, elems);
  EXPECT_TRUE(matches("residual out", d_out, out, kBitExact));
  cpu_.accumulate(out.data(), b.data(), elems);
  gpu_->accumulate(d_out, d_b, elems);
  EXPECT_TRUE(matches("accumulate", d_out, out, kBitExact));
  cpu_.scale(out.data(), elems, 0.37f);
  gpu_->scale(d_out, elems, 0.37f);
  EXPECT_TRUE(matches("scale", d_out, out, kBitExact));
  cpu_.fill_zero(out.data(), elems - 1);
  gpu_->fill_zero(d_out, elems - 1);
  EXPECT_TRUE(matches("fill_zero", d_out, out, kBitExact));
}

TEST_P(CudaOpsShapes, SoftmaxCrossEntropy) {
  const OpShape s = GetParam();
  check_cross_entropy(s.rows(), s.vocab, "");
}

// GPT-2's vocabulary on enough rows that each row gets one warp, whose row spans many
// chunks of loads (the running max moves between them), at every alignment of a row.
TEST_F(CudaOpsTest, SoftmaxCrossEntropyAtGpt2Vocabulary) {
  check_cross_entropy(4096, 50257, " (4096 x 50257)");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsShapes, ::testing::ValuesIn(kShapes),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(CudaOpsTest, SumsInDoubleAreAccurateAndDeterministic) {
  EXPECT_EQ(gpu_->sum(nullptr, 0), 0.0);
  EXPECT_EQ(gpu_->sum_of_squares(nullptr, 0), 0.0);
  for (size_t elems : {size_t{1}, size_t{33}, size_t{1000}, size_t{262147}, size_t{1000003}}) {
    const auto x = random_floats(elems, 80 + elems, -1.0f, 3.0f);
    const float* d_x = upload(x);
    double magnitude = 0.0, squares_magnitude = 0.0;
    for (float value : x) {
      magnitude += std::fabs(value);
      squares_magnitude += double{value} * value;
    }
    const std::string label = " of " + std::to_string(elems);
    const double gpu_sum = gpu_->sum(d_x, elems), gpu_squares = gpu_->sum_of_squares(d_x, elems);
    EXPECT_TRUE(all_close("sum" + label, std::vector<double>{gpu_sum},
                          std::vector<double>{cpu_.sum(x.data(), elems)},
                          Tolerance{kDoubleSumRelative * magnitude, 0.0}));
    EXPECT_TRUE(all_close("sum_of_squares" + label, std::vector<double>{gpu_squares},
                          std::vector<double>{cpu_.sum_of_squares(x.data(), elems)},
                          Tolerance{kDoubleSumRelative * squares_magnitude, 0.0}));
    EXPECT_EQ(gpu_->sum(d_x, elems), gpu_sum) << "repeated sums must be bit-identical";
    EXPECT_EQ(gpu_->sum_of_squares(d_x, elems), gpu_squares);
  }
}

TEST_F(CudaOpsTest, AdamWStepsAreBitIdentical) {
  const size_t elems = 100003;
  auto params = random_floats(elems, 90), m = random_floats(elems, 91, -0.1f, 0.1f);
  auto v = random_floats(elems, 92, 0.0f, 0.01f);
  float *d_params = upload(params), *d_m = upload(m), *d_v = upload(v);
  for (int step = 1; step <= 3; ++step) {
    AdamWParams hyper;
    hyper.learning_rate = 3e-3f;
    hyper.weight_decay = step == 2 ? 0.0f : 0.1f;
    hyper.step = step;
    const auto grads = random_floats(elems, 93 + step);
    cpu_.adamw_update(params.data(), grads.data(), m.data(), v.data(), elems, hyper);
    gpu_->adamw_update(d_params, upload(grads), d_m, d_v, elems, hyper);
    const std::string label = " after step " + std::to_string(step);
    EXPECT_TRUE(matches("adamw params" + label, d_params, params, kBitExact));
    EXPECT_TRUE(matches("adamw m" + label, d_m, m, kBitExact));
    EXPECT_TRUE(matches("adamw v" + label, d_v, v, kBitExact));
  }
}

// ---- a whole model step ---------------------------------------------------------------

// The one-launch AdamW over a model's pieces against the CPU's piece-by-piece steps: the
// pieces' sizes straddle the kernel's tiles (2048 elements) or fall far inside one, and
// empty pieces are left out of the launch.
TEST_F(CudaOpsTest, AdamWOverPiecesIsThePieceByPieceStep) {
  const std::vector<AdamWPiece> pieces = {{0, 768, 0.0f},          {768, 768, 0.1f},
                                          {768, 3 * 2048 + 5, 0.1f}, {3 * 2048 + 5, 3 * 2048 + 6, 0.0f},
                                          {3 * 2048 + 6, 40000, 0.1f}, {40000, 41001, 0.0f}};
  const size_t elems = pieces.back().end_elems;
  auto params = random_floats(elems, 94), m = random_floats(elems, 95, -0.1f, 0.1f);
  auto v = random_floats(elems, 96, 0.0f, 0.01f);
  float *d_params = upload(params), *d_m = upload(m), *d_v = upload(v);
  for (int step = 1; step <= 2; ++step) {
    AdamWParams hyper;
    hyper.learning_rate = 3e-3f;
    hyper.weight_decay = 0.5f;  // each piece's own decay replaces it
    hyper.step = step;
    const auto grads = random_floats(elems, 97 + step);
    EXPECT_FALSE(cpu_.adamw_update_pieces(params.data(), grads.data(), m.data(), v.data(), pieces, hyper));
    EXPECT_FALSE(gpu_->adamw_update_pieces(d_params, upload(grads), d_m, d_v, pieces, hyper))
        << "fp32 has no compute copy to refresh";
    const std::string label = " after step " + std::to_string(step);
    EXPECT_TRUE(matches("adamw pieces params" + label, d_params, params, kBitExact));
    EXPECT_TRUE(matches("adamw pieces m" + label, d_m, m, kBitExact));
    EXPECT_TRUE(matches("adamw pieces v" + label, d_v, v, kBitExact));
  }
}

// In bf16 and fp16 the pieces' step writes the parameters' 16-bit copy as it goes: a GEMM
// that reads the copy then gives the same bits as after parameters_changed's cast.
TEST_F(CudaOpsTest, AdamWOverPiecesRefreshesTheComputeCopy) {
  for (Precision precision : {Precision::bf16, Precision::fp16}) {
    CudaOps half(0, precision);
    const int rows = 64, in_channels = 256, out_channels = 128;
    const size_t weight_elems = size_t(in_channels) * out_channels;
    const std::vector<AdamWPiece> pieces = {{0, weight_elems / 2, 0.1f}, {weight_elems / 2, weight_elems, 0.0f}};
    std::vector<float*> owned;
    auto device = [&](const std::vector<float>& host, MemoryKind kind) {
      float* p = half.allocate_floats(host.size(), kind);
      half.copy_from_host(p, host.data(), host.size());
      owned.push_back(p);
      return p;
    };
    const auto params = random_floats(weight_elems, 110), grads = random_floats(weight_elems, 111);
    const auto moments = random_floats(weight_elems, 112, 0.0f, 0.01f);
    float* fused = device(params, MemoryKind::parameters);
    float* cast = device(params, MemoryKind::parameters);
    half.parameters_changed(fused, 0, weight_elems);
    half.parameters_changed(cast, 0, weight_elems);
    float *d_grads = device(grads, MemoryKind::gradients), *m1 = device(moments, MemoryKind::optimizer);
    float *v1 = device(moments, MemoryKind::optimizer), *m2 = device(moments, MemoryKind::optimizer);
    float* v2 = device(moments, MemoryKind::optimizer);
    AdamWParams hyper;
    hyper.learning_rate = 0.05f;  // large enough that every 16-bit weight moves
    hyper.step = 1;
    EXPECT_TRUE(half.adamw_update_pieces(fused, d_grads, m1, v1, pieces, hyper))
        << precision_name(precision) << ": the copy is written in the same pass";
    for (const AdamWPiece& piece : pieces) {
      AdamWParams piece_hyper = hyper;
      piece_hyper.weight_decay = piece.weight_decay;
      half.adamw_update(cast + piece.begin_elems, d_grads + piece.begin_elems, m2 + piece.begin_elems,
                        v2 + piece.begin_elems, piece.end_elems - piece.begin_elems, piece_hyper);
    }
    half.parameters_changed(cast, 0, weight_elems);
    const auto inp = random_floats(size_t(rows) * in_channels, 113);
    float* d_inp = device(inp, MemoryKind::activations);
    float* out_fused = device(std::vector<float>(size_t(rows) * out_channels), MemoryKind::activations);
    float* out_cast = device(std::vector<float>(size_t(rows) * out_channels), MemoryKind::activations);
    half.matmul_forward(out_fused, d_inp, fused, nullptr, rows, in_channels, out_channels);
    half.matmul_forward(out_cast, d_inp, cast, nullptr, rows, in_channels, out_channels);
    std::vector<float> got(size_t(rows) * out_channels), want(got.size()), master(weight_elems), reference(weight_elems);
    half.copy_to_host(got.data(), out_fused, got.size());
    half.copy_to_host(want.data(), out_cast, want.size());
    half.copy_to_host(master.data(), fused, weight_elems);
    half.copy_to_host(reference.data(), cast, weight_elems);
    EXPECT_TRUE(all_close(std::string(precision_name(precision)) + " masters", master, reference, kBitExact));
    EXPECT_TRUE(all_close(std::string(precision_name(precision)) + " GEMM from the written copy", got, want,
                          kBitExact));
    for (float* p : owned) half.release(p);
  }
}

TEST_F(CudaOpsTest, WholeModelLossAndGradientsMatchTheCpu) {
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
    const auto inputs = random_ids(size_t(batch) * seq, 100, shape.vocab);
    const auto targets = random_ids(size_t(batch) * seq, 101, shape.vocab);

    cpu_model.forward(inputs.data(), targets.data(), nullptr);
    gpu_model.forward(inputs.data(), targets.data(), nullptr);
    const double cpu_loss = cpu_model.mean_loss(), gpu_loss = gpu_model.mean_loss();
    EXPECT_TRUE(all_close("mean loss" + label, std::vector<double>{gpu_loss},
                          std::vector<double>{cpu_loss}, kModelLoss));

    const float loss_scale = 1.0f / static_cast<float>(batch * seq);
    std::vector<float> cpu_grads(param_elems, 0.0f);
    FullGradient cpu_sink(cpu_grads.data());
    cpu_model.backward(cpu_sink, loss_scale);
    float* d_grads = upload(std::vector<float>(param_elems, 0.0f));
    FullGradient gpu_sink(d_grads);
    gpu_model.backward(gpu_sink, loss_scale);
    const auto gpu_grads = download(d_grads, param_elems);

    for (const TensorSpec& tensor : layout.tensors) {
      const auto begin = static_cast<std::ptrdiff_t>(tensor.offset_elems);
      const auto end = begin + static_cast<std::ptrdiff_t>(tensor.elems);
      const std::vector<float> ref(cpu_grads.begin() + begin, cpu_grads.begin() + end);
      const std::vector<float> got(gpu_grads.begin() + begin, gpu_grads.begin() + end);
      double scale = 0.0;
      for (float value : ref) scale = std::max(scale, double{std::fabs(value)});
      EXPECT_GT(scale, 0.0) << tensor.name << label << ": an all-zero gradient tests nothing";
      EXPECT_TRUE(all_close("gradient of " + tensor.name + label, got, ref,
                            Tolerance{kModelGradient.atol * scale, kModelGradient.rtol}));
    }

    // The same step again on the GPU gives the same bits: no atomics, fixed reductions.
    gpu_model.forward(inputs.data(), targets.data(), nullptr);
    EXPECT_EQ(gpu_model.mean_loss(), gpu_loss) << "repeated forward" << label;
    gpu_->fill_zero(d_grads, param_elems);
    gpu_model.backward(gpu_sink, loss_scale);
    EXPECT_TRUE(all_close("repeated backward" + label, download(d_grads, param_elems), gpu_grads,
                          kBitExact));
  }
}

}  // namespace
}  // namespace scalestudy
