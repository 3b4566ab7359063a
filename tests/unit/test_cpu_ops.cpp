// The CPU backend is the oracle for every other backend, so it is checked against things
// that do not share its code: hand-computed values, double-precision references written
// here, and central finite differences of the forward for every backward
// (cpu_ops_checks.h). This file holds the layers' ops; test_cpu_loss_optimizer_ops.cpp the
// cross-entropy, the classifier, the reductions and the optimizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "cpu_ops_checks.h"

namespace scalestudy {
namespace {

using namespace cpu_ops_test;

// ---- double-precision references ----------------------------------------------------

void attention_reference(std::vector<double>& out, std::vector<double>& probs,
                         const std::vector<double>& qkv, const AttentionShape& shape) {
  const int hs = shape.channels / shape.heads;
  const int T = shape.seq;
  const int C = shape.channels;
  out.assign(static_cast<size_t>(shape.batch) * T * C, 0.0);
  probs.assign(static_cast<size_t>(shape.batch) * shape.heads * T * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(static_cast<size_t>(b) * T + t) * 3 * C + part * C + h * hs + i];
  };
  for (int b = 0; b < shape.batch; ++b) {
    for (int h = 0; h < shape.heads; ++h) {
      for (int t = 0; t < T; ++t) {
        std::vector<double> weights(T, 0.0);
        double max_score = -1e300;
        for (int t2 = 0; t2 < T; ++t2) {
          if (shape.causal && t2 > t) continue;
          double score = 0.0;
          for (int i = 0; i < hs; ++i) score += at(b, t, 0, h, i) * at(b, t2, 1, h, i);
          weights[t2] = score / std::sqrt(static_cast<double>(hs));
          max_score = std::max(max_score, weights[t2]);
        }
        double total = 0.0;
        for (int t2 = 0; t2 < T; ++t2) {
          weights[t2] = (shape.causal && t2 > t) ? 0.0 : std::exp(weights[t2] - max_score);
          total += weights[t2];
        }
        for (int t2 = 0; t2 < T; ++t2) {
          double p = weights[t2] / total;
          probs[((static_cast<size_t>(b) * shape.heads + h) * T + t) * T + t2] = p;
          for (int i = 0; i < hs; ++i) {
            out[(static_cast<size_t>(b) * T + t) * C + h * hs + i] += p * at(b, t2, 2, h, i);
          }
        }
      }
    }
  }
}


// ---- memory -------------------------------------------------------------------------

TEST(CpuOpsMemory, AccountsBytesByKindAndReleases) {
  CpuOps ops;
  EXPECT_EQ(ops.name(), "cpu");
  float* params = ops.allocate_floats(100, MemoryKind::parameters);
  float* more_params = ops.allocate_floats(3, MemoryKind::parameters);
  int32_t* tokens = ops.allocate_ints(7, MemoryKind::activations);
  ASSERT_NE(params, nullptr);
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(params) % 64, 0u) << "cache-line aligned";
  EXPECT_EQ(ops.allocated_bytes(MemoryKind::parameters), 103 * sizeof(float));
  EXPECT_EQ(ops.allocated_bytes(MemoryKind::activations), 7 * sizeof(int32_t));
  EXPECT_EQ(ops.allocated_bytes(MemoryKind::gradients), 0u);
  ops.release(params);
  EXPECT_EQ(ops.allocated_bytes(MemoryKind::parameters), 3 * sizeof(float));
  ops.release(more_params);
  ops.release(tokens);
  ops.release(nullptr);
  const char* names[] = {"parameters", "gradients", "optimizer", "activations", "communication",
                         "other"};
  for (int k = 0; k < kMemoryKindCount; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    EXPECT_STREQ(memory_kind_name(kind), names[k]);
    EXPECT_EQ(ops.allocated_bytes(kind), 0u) << names[k];
  }
}

TEST(CpuOpsMemory, CopiesAndZeroFills) {
  CpuOps ops;
  const size_t elems = 37;
  std::vector<float> host = random_floats(elems, 1), back(elems, -7.0f);
  float* a = ops.allocate_floats(elems, MemoryKind::other);
  float* b = ops.allocate_floats(elems, MemoryKind::other);
  ops.copy_from_host(a, host.data(), elems);
  ops.copy(b, a, elems);
  ops.copy_to_host(back.data(), b, elems);
  EXPECT_TRUE(all_close("copy round trip", back, host, kExact));
  ops.fill_zero(b, elems);
  ops.copy_to_host(back.data(), b, elems);
  EXPECT_TRUE(all_close("fill_zero", back, std::vector<float>(elems, 0.0f), kExact));
  std::vector<int32_t> host_ints = random_ints(elems, 2, 1000);
  int32_t* ints = ops.allocate_ints(elems, MemoryKind::other);
  ops.copy_ints_from_host(ints, host_ints.data(), elems);
  EXPECT_EQ(std::vector<int32_t>(ints, ints + elems), host_ints);
  ops.synchronize();
  ops.release(a);
  ops.release(b);
  ops.release(ints);
}

// ---- embedding ----------------------------------------------------------------------

// Token 3 fills batch 0 and comes twice more in batch 1, so its gradient row collects
// seven contributions. Small integers keep every sum exact in any order.
TEST(CpuOpsEmbedding, ForwardAndBackwardWithRepeatedTokens) {
  CpuOps ops;
  const std::vector<int32_t> tokens = {3, 3, 3, 3, 3, 0, 3, 7, 3, 10};
  auto wte = random_floats(kVocab * kChannels, 4), wpe = random_floats(kSeq * kChannels, 5);
  std::vector<float> out(kRows * kChannels), expected_out(kRows * kChannels);
  std::vector<float> dout(kRows * kChannels);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = static_cast<float>(int(i % 7) - 3);
  std::vector<float> dwte(kVocab * kChannels, 1.0f), dwpe(kSeq * kChannels, 2.0f);
  std::vector<float> expected_wte = dwte, expected_wpe = dwpe;
  for (int n = 0; n < kRows; ++n) {
    for (int c = 0; c < kChannels; ++c) {
      const int token_elem = tokens[n] * kChannels + c, position_elem = (n % kSeq) * kChannels + c;
      expected_out[n * kChannels + c] = wte[token_elem] + wpe[position_elem];
      expected_wte[token_elem] += dout[n * kChannels + c];
      expected_wpe[position_elem] += dout[n * kChannels + c];
    }
  }
  ops.embedding_forward({.out = out.data(), .tokens = tokens.data(), .wte = wte.data(),
                         .wpe = wpe.data(), .batch = kBatch, .seq = kSeq, .channels = kChannels});
  ops.embedding_backward({.dwte = dwte.data(), .dwpe = dwpe.data(), .dout = dout.data(),
                          .tokens = tokens.data(), .batch = kBatch, .seq = kSeq,
                          .channels = kChannels});
  EXPECT_TRUE(all_close("embedding out", out, expected_out, kExact));
  EXPECT_TRUE(all_close("dwte", dwte, expected_wte, kExact));
  EXPECT_TRUE(all_close("dwpe", dwpe, expected_wpe, kExact));
}

TEST(CpuOpsEmbedding, BackwardMatchesFiniteDifferences) {
  CpuOps ops;
  auto tokens = random_ints(kRows, 6, kVocab);
  auto wte = random_floats(kVocab * kChannels, 7), wpe = random_floats(kSeq * kChannels, 8);
  auto r = random_floats(kRows * kChannels, 9);
  std::vector<float> out(kRows * kChannels);
  auto objective = [&] {
    ops.embedding_forward({.out = out.data(), .tokens = tokens.data(), .wte = wte.data(),
                           .wpe = wpe.data(), .batch = kBatch, .seq = kSeq, .channels = kChannels});
    return weighted_sum(out, r);
  };
  const auto dwte_prior = random_floats(wte.size(), 10), dwpe_prior = random_floats(wpe.size(), 11);
  auto dwte = dwte_prior, dwpe = dwpe_prior;
  ops.embedding_backward({.dwte = dwte.data(), .dwpe = dwpe.data(), .dout = r.data(),
                          .tokens = tokens.data(), .batch = kBatch, .seq = kSeq,
                          .channels = kChannels});
  EXPECT_TRUE(gradient_matches("dwte", dwte, dwte_prior, wte, objective, kFp32GradTolerance));
  EXPECT_TRUE(gradient_matches("dwpe", dwpe, dwpe_prior, wpe, objective, kFp32GradTolerance));
}

// ---- LayerNorm ----------------------------------------------------------------------

TEST(CpuOpsLayerNorm, ForwardNormalisesEachRow) {
  CpuOps ops;
  auto inp = random_floats(kRows * kChannels, 12, -3.0f, 5.0f);
  std::vector<float> ones(kChannels, 1.0f), zeros(kChannels, 0.0f);
  std::vector<float> out(inp.size()), mean(kRows), rstd(kRows);
  ops.layernorm_forward({.out = out.data(), .mean = mean.data(), .rstd = rstd.data(),
                         .inp = inp.data(), .weight = ones.data(), .bias = zeros.data(),
                         .rows = kRows, .channels = kChannels});
  auto row_stats = [](const std::vector<float>& x, int n) {  // {mean, biased variance}
    double m = 0.0, v = 0.0;
    for (int c = 0; c < kChannels; ++c) m += x[n * kChannels + c] / double{kChannels};
    for (int c = 0; c < kChannels; ++c) v += std::pow(x[n * kChannels + c] - m, 2) / kChannels;
    return std::pair<double, double>{m, v};
  };
  std::vector<double> out_means(kRows), out_vars(kRows), ref_mean(kRows), ref_rstd(kRows);
  for (int n = 0; n < kRows; ++n) {
    const auto [m, v] = row_stats(inp, n);
    ref_mean[n] = m;
    ref_rstd[n] = 1.0 / std::sqrt(v + 1e-5);
    out_means[n] = row_stats(out, n).first;
    out_vars[n] = row_stats(out, n).second * (v + 1e-5) / v;  // undo epsilon's pull below 1
  }
  EXPECT_TRUE(all_close("row means of out", out_means, std::vector<double>(kRows, 0.0),
                        kForwardTolerance));
  EXPECT_TRUE(all_close("row variances of out", out_vars, std::vector<double>(kRows, 1.0),
                        kForwardTolerance));
  EXPECT_TRUE(all_close("mean", mean, ref_mean, kForwardTolerance));
  EXPECT_TRUE(all_close("rstd", rstd, ref_rstd, kForwardTolerance));

  auto weight = random_floats(kChannels, 13), bias = random_floats(kChannels, 14);
  ops.layernorm_forward({.out = out.data(), .mean = mean.data(), .rstd = rstd.data(),
                         .inp = inp.data(), .weight = weight.data(), .bias = bias.data(),
                         .rows = kRows, .channels = kChannels});
  std::vector<double> expected(inp.size());
  for (size_t i = 0; i < inp.size(); ++i) {
    const size_t n = i / kChannels, c = i % kChannels;
    expected[i] = (inp[i] - ref_mean[n]) * ref_rstd[n] * weight[c] + bias[c];
  }
  EXPECT_TRUE(all_close("affine out", out, expected, kForwardTolerance));
}

TEST(CpuOpsLayerNorm, BackwardMatchesFiniteDifferences) {
  CpuOps ops;
  auto inp = random_floats(kRows * kChannels, 15), r = random_floats(kRows * kChannels, 18);
  auto weight = random_floats(kChannels, 16, 0.5f, 1.5f), bias = random_floats(kChannels, 17);
  std::vector<float> out(inp.size()), mean(kRows), rstd(kRows);
  auto objective = [&] {
    ops.layernorm_forward({.out = out.data(), .mean = mean.data(), .rstd = rstd.data(),
                           .inp = inp.data(), .weight = weight.data(), .bias = bias.data(),
                           .rows = kRows, .channels = kChannels});
    return weighted_sum(out, r);
  };
  objective();
  const auto dinp_prior = random_floats(inp.size(), 19);
  const auto dweight_prior = random_floats(kChannels, 20);
  const auto dbias_prior = random_floats(kChannels, 21);
  auto dinp = dinp_prior, dweight = dweight_prior, dbias = dbias_prior;
  ops.layernorm_backward({.dinp = dinp.data(), .dweight = dweight.data(), .dbias = dbias.data(),
                          .dout = r.data(), .inp = inp.data(), .weight = weight.data(),
                          .mean = mean.data(), .rstd = rstd.data(), .rows = kRows,
                          .channels = kChannels, .dinp_write = GradientWrite::accumulate});
  EXPECT_TRUE(gradient_matches("dinp", dinp, dinp_prior, inp, objective, kFp32GradTolerance));
  EXPECT_TRUE(
      gradient_matches("dweight", dweight, dweight_prior, weight, objective, kFp32GradTolerance));
  EXPECT_TRUE(gradient_matches("dbias", dbias, dbias_prior, bias, objective, kFp32GradTolerance));
}

// ---- dense layer --------------------------------------------------------------------

// 13 and 16 input channels exercise both the vector body and the tail of the dot product.
TEST(CpuOpsMatmul, ForwardMatchesDoubleReference) {
  CpuOps ops;
  const int out_channels = 12;
  for (int in_channels : {13, 16}) {
    for (bool with_bias : {true, false}) {
      auto inp = random_floats(kRows * in_channels, 22);
      auto weight = random_floats(out_channels * in_channels, 23);
      auto bias = random_floats(out_channels, 24);
      std::vector<float> out(kRows * out_channels);
      std::vector<double> expected(out.size());
      ops.matmul_forward({.out = out.data(), .inp = inp.data(), .weight = weight.data(),
                          .bias = with_bias ? bias.data() : nullptr, .rows = kRows,
                          .in_channels = in_channels, .out_channels = out_channels});
      for (int n = 0; n < kRows; ++n) {
        for (int o = 0; o < out_channels; ++o) {
          double total = with_bias ? bias[o] : 0.0;
          for (int i = 0; i < in_channels; ++i) {
            total += double{inp[n * in_channels + i]} * weight[o * in_channels + i];
          }
          expected[n * out_channels + o] = total;
        }
      }
      EXPECT_TRUE(all_close("out (IC=" + std::to_string(in_channels) +
                                (with_bias ? ", bias)" : ", no bias)"),
                            out, expected, kForwardTolerance));
    }
  }
}

// With a residual, out is the residual plus the layer's fp32 result: the same bits as the
// layer alone followed by the residual stream's fp32 add.
TEST(CpuOpsMatmul, ResidualIsAddedToTheLayersResult) {
  CpuOps ops;
  const int in_channels = 13, out_channels = 12;
  const auto inp = random_floats(kRows * in_channels, 25);
  const auto weight = random_floats(out_channels * in_channels, 26);
  const auto bias = random_floats(out_channels, 27);
  const auto residual = random_floats(kRows * out_channels, 28);
  std::vector<float> layer(residual.size()), out(residual.size());
  const MatmulForwardArgs<float> args{.out = layer.data(), .inp = inp.data(), .weight = weight.data(),
                                      .bias = bias.data(), .rows = kRows, .in_channels = in_channels,
                                      .out_channels = out_channels};
  ops.matmul_forward(args);
  MatmulForwardArgs<float> added = args;
  added.out = out.data();
  added.residual = residual.data();
  ops.matmul_forward(added);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], residual[i] + layer[i]) << "element " << i;
}

TEST(CpuOpsMatmul, BackwardMatchesFiniteDifferences) {
  CpuOps ops;
  const int in_channels = 13, out_channels = 12;
  for (bool with_bias : {true, false}) {
    auto inp = random_floats(kRows * in_channels, 25);
    auto weight = random_floats(out_channels * in_channels, 26);
    auto bias = random_floats(out_channels, 27);
    auto r = random_floats(kRows * out_channels, 28);
    std::vector<float> out(r.size());
    auto objective = [&] {
      ops.matmul_forward({.out = out.data(), .inp = inp.data(), .weight = weight.data(),
                          .bias = with_bias ? bias.data() : nullptr, .rows = kRows,
                          .in_channels = in_channels, .out_channels = out_channels});
      return weighted_sum(out, r);
    };
    const auto dinp_prior = random_floats(inp.size(), 29);
    const auto dweight_prior = random_floats(weight.size(), 30);
    const auto dbias_prior = random_floats(bias.size(), 31);
    auto dinp = dinp_prior, dweight = dweight_prior, dbias = dbias_prior;
    ops.matmul_backward({.dinp = dinp.data(), .dweight = dweight.data(),
                         .dbias = with_bias ? dbias.data() : nullptr, .dout = r.data(),
                         .inp = inp.data(), .weight = weight.data(), .rows = kRows,
                         .in_channels = in_channels, .out_channels = out_channels,
                         .dinp_write = GradientWrite::accumulate});
    const std::string label = with_bias ? " (bias)" : " (no bias)";
    EXPECT_TRUE(gradient_matches("dinp" + label, dinp, dinp_prior, inp, objective,
                                 kFp32GradTolerance));
    EXPECT_TRUE(gradient_matches("dweight" + label, dweight, dweight_prior, weight, objective,
                                 kFp32GradTolerance));
    if (with_bias) {
      EXPECT_TRUE(
          gradient_matches("dbias", dbias, dbias_prior, bias, objective, kFp32GradTolerance));
    }
  }
}

// Augmented rows (kernels/op_params.h): the LayerNorm writes each row at the stride with
// the columns (1, 0, ..., 0) after it, and the dense layer reads its rows there. The CPU
// computes the same values in the same order either way: bit for bit the plain results.
TEST(CpuOpsMatmul, AugmentedRowsGiveThePlainResults) {
  CpuOps ops;
  const int stride = kChannels + kAugmentedColumns + 3, out_channels = 12;
  auto x = random_floats(kRows * kChannels, 50), r = random_floats(kRows * out_channels, 51);
  auto ln_weight = random_floats(kChannels, 52, 0.5f, 1.5f), ln_bias = random_floats(kChannels, 53);
  auto weight = random_floats(out_channels * kChannels, 54), bias = random_floats(out_channels, 55);
  std::vector<float> plain(x.size()), augmented(size_t(kRows) * stride, -7.0f), mean(kRows),
      rstd(kRows);
  for (int row_stride : {0, stride}) {
    ops.layernorm_forward({.out = row_stride == 0 ? plain.data() : augmented.data(),
                           .mean = mean.data(), .rstd = rstd.data(), .inp = x.data(),
                           .weight = ln_weight.data(), .bias = ln_bias.data(), .rows = kRows,
                           .channels = kChannels, .out_stride = row_stride});
  }
  for (int n = 0; n < kRows; ++n) {
    const float* row = augmented.data() + size_t(n) * stride;
    for (int c = 0; c < kChannels; ++c) ASSERT_EQ(row[c], plain[size_t(n) * kChannels + c]);
    for (int c = 0; c < kAugmentedColumns; ++c) ASSERT_EQ(row[kChannels + c], c == 0 ? 1.0f : 0.0f);
    for (int c = kChannels + kAugmentedColumns; c < stride; ++c) ASSERT_EQ(row[c], -7.0f);
  }
  std::vector<float> plain_out(r.size()), augmented_out(r.size());
  ops.matmul_forward({.out = plain_out.data(), .inp = plain.data(), .weight = weight.data(),
                      .bias = bias.data(), .rows = kRows, .in_channels = kChannels,
                      .out_channels = out_channels});
  ops.matmul_forward({.out = augmented_out.data(), .inp = augmented.data(), .weight = weight.data(),
                      .bias = bias.data(), .rows = kRows, .in_channels = kChannels,
                      .out_channels = out_channels, .inp_stride = stride});
  EXPECT_EQ(augmented_out, plain_out);
  std::vector<std::vector<float>> gradients;  // dinp, dweight, dbias of each layout
  for (int row_stride : {0, stride}) {
    std::vector<float> dinp(x.size()), dweight(weight.size(), 0.5f), dbias(out_channels, 0.25f);
    ops.matmul_backward({.dinp = dinp.data(), .dweight = dweight.data(), .dbias = dbias.data(),
                         .dout = r.data(), .inp = row_stride == 0 ? plain.data() : augmented.data(),
                         .weight = weight.data(), .rows = kRows, .in_channels = kChannels,
                         .out_channels = out_channels, .dinp_write = GradientWrite::overwrite,
                         .inp_stride = row_stride});
    gradients.insert(gradients.end(), {dinp, dweight, dbias});
  }
  EXPECT_EQ(gradients[3], gradients[0]);
  EXPECT_EQ(gradients[4], gradients[1]);
  EXPECT_EQ(gradients[5], gradients[2]);
}

// ---- attention ----------------------------------------------------------------------

constexpr int kQkvElems = kRows * 3 * kChannels;
constexpr int kProbElems = kBatch * kHeads * kSeq * kSeq;

TEST(CpuOpsAttention, ForwardMatchesReferenceAndMasks) {
  CpuOps ops;
  for (bool causal : {true, false}) {
    const AttentionShape shape{kBatch, kSeq, kChannels, kHeads, causal};
    auto qkv = random_floats(kQkvElems, 33, -2.0f, 2.0f);
    std::vector<float> out(kRows * kChannels), probs(kProbElems);
    ops.attention_forward(out.data(), probs.data(), qkv.data(), shape);
    std::vector<double> ref_out, ref_probs, row_sums, masked;
    attention_reference(ref_out, ref_probs, to_double(qkv), shape);
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    EXPECT_TRUE(all_close("out" + label, out, ref_out, kForwardTolerance));
    EXPECT_TRUE(all_close("probs" + label, probs, ref_probs, kForwardTolerance));
    for (int row = 0; row < kBatch * kHeads * kSeq; ++row) {
      double total = 0.0;
      for (int t2 = 0; t2 < kSeq; ++t2) {
        total += probs[row * kSeq + t2];
        if (causal && t2 > row % kSeq) masked.push_back(probs[row * kSeq + t2]);
      }
      row_sums.push_back(total);
    }
    EXPECT_TRUE(all_close("probs row sums" + label, row_sums,
                          std::vector<double>(row_sums.size(), 1.0), kForwardTolerance));
    if (!causal) continue;
    EXPECT_TRUE(all_close("masked probs", masked, std::vector<double>(masked.size(), 0.0), kExact));
    // The first token can only attend to itself, so its output is exactly its own V.
    for (int b = 0; b < kBatch; ++b) {
      const auto value0 = qkv.begin() + b * kSeq * 3 * kChannels + 2 * kChannels;
      const auto out0 = out.begin() + b * kSeq * kChannels;
      EXPECT_TRUE(all_close("out[b,0] vs V[b,0]", std::vector<float>(out0, out0 + kChannels),
                            std::vector<float>(value0, value0 + kChannels), kExact));
    }
  }
}

TEST(CpuOpsAttention, BackwardMatchesFiniteDifferences) {
  CpuOps ops;
  for (bool causal : {true, false}) {
    const AttentionShape shape{kBatch, kSeq, kChannels, kHeads, causal};
    auto qkv = random_floats(kQkvElems, 34, -2.0f, 2.0f), r = random_floats(kRows * kChannels, 35);
    std::vector<float> out(r.size()), probs(kProbElems);
    ops.attention_forward(out.data(), probs.data(), qkv.data(), shape);
    const auto dqkv_prior = random_floats(qkv.size(), 36);
    auto dqkv = dqkv_prior;
    ops.attention_backward(dqkv.data(), r.data(), qkv.data(), out.data(), probs.data(), shape, GradientWrite::accumulate);
    std::vector<double> qkv_double = to_double(qkv), ref_out, ref_probs;
    auto objective = [&] {
      attention_reference(ref_out, ref_probs, qkv_double, shape);
      return weighted_sum(ref_out, r);
    };
    EXPECT_TRUE(gradient_matches(causal ? "dqkv (causal)" : "dqkv (bidirectional)", dqkv,
                                 dqkv_prior, qkv_double, objective, kDoubleGradTolerance));
  }
}

// ---- GELU ---------------------------------------------------------------------------

TEST(CpuOpsGelu, ForwardKnownValues) {
  CpuOps ops;
  std::vector<float> inp = {0.0f, 1.0f, -1.0f, 2.0f, -3.0f, 0.5f, 10.0f, -10.0f};
  // 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715 x^3))), evaluated in double.
  std::vector<double> expected = {0.0,  0.8411919906082768, -0.15880800939172324,
                                  1.954597694087775, -0.0036373920817729943,
                                  0.34571400982514394, 10.0, 0.0};
  std::vector<float> out(inp.size());
  ops.gelu_forward(out.data(), inp.data(), inp.size());
  EXPECT_TRUE(all_close("gelu", out, expected, kForwardTolerance));
}

TEST(CpuOpsGelu, BackwardMatchesFiniteDifferences) {
  CpuOps ops;
  auto inp = random_floats(kRows * kChannels, 37, -4.0f, 4.0f), r = random_floats(inp.size(), 38);
  std::vector<float> out(inp.size());
  auto objective = [&] {
    ops.gelu_forward(out.data(), inp.data(), inp.size());
    return weighted_sum(out, r);
  };
  const auto dinp_prior = random_floats(inp.size(), 39);
  auto dinp = dinp_prior;
  ops.gelu_backward(dinp.data(), inp.data(), r.data(), inp.size(), GradientWrite::accumulate);
  EXPECT_TRUE(gradient_matches("dinp", dinp, dinp_prior, inp, objective, kFp32GradTolerance));
}

// ---- accumulate ---------------------------------------------------------------------

TEST(CpuOpsAccumulate, AddsExactly) {
  CpuOps ops;
  std::vector<float> dst = {1, -2, 3, 4.5f, 0.25f};
  const std::vector<float> src = {10, 20, -30, 0.5f, 0.75f};
  const std::vector<float> expected = {11, 18, -27, 5, 1};
  ops.accumulate(dst.data(), src.data(), dst.size());
  EXPECT_TRUE(all_close("accumulate", dst, expected, kExact));
}

}  // namespace
}  // namespace scalestudy
