#pragma once
// The fixture of the fp32 CUDA op tests: the backend in fp32 mode, every op against the CPU
// reference (the oracle) on identical inputs, and the tolerances, each derived next to its
// name. The 16-bit fixture (cuda_ops_half_fixture.h) keeps these bounds for its fp32
// results.
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

namespace scalestudy::gpu_test {

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

// The op shapes' test names: medium, odd, tiny.
inline std::string shape_test_name(const ::testing::TestParamInfo<OpShape>& info) {
  return info.param.name;
}

// Runs a file's CudaOpsShapes tests at every op shape (CudaOpsShapes.Matmul/odd).
#define SCALESTUDY_FP32_SHAPE_TESTS() \
  INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsShapes, ::testing::ValuesIn(kShapes), shape_test_name)

}  // namespace scalestudy::gpu_test
