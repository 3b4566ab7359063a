// The CPU backend is the oracle for every other backend, so it is checked against things
// that do not share its code: hand-computed values, double-precision references written
// here, and central finite differences of the forward for every backward.
//
// Every backward check uses the scalar objective L = sum(out * R) with a fixed random R,
// so the upstream gradient is dout = R. Gradient buffers start from random "prior"
// values, and the check is on (after - prior), which also proves that backward ops
// accumulate (+=) rather than overwrite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "op_checks.h"

namespace scalestudy {
namespace {

using op_test::all_close;
using op_test::random_floats;
using op_test::Rng;
using op_test::Tolerance;

// fp32 forward against a double reference: a few fp32 roundings of O(1) values over
// reductions of at most ~16 terms.
constexpr Tolerance kForwardTolerance{1e-6, 1e-5};
// Central differences of the fp32 forward with step kFp32Step (relative to max(1,|x|)).
// Truncation vanishes for the linear ops and is ~step^2/6 * |f'''| for LayerNorm and
// GELU; fp32 rounding of the perturbed outputs adds ~ulp(out)/step ~ 1e-5 per output
// that moves. The largest error seen is 8e-5 (LayerNorm dinp): ~6x margin, while a
// wrong term (an O(0.1) error) still fails by orders of magnitude.
constexpr double kFp32Step = 1e-2;
constexpr Tolerance kFp32GradTolerance{5e-4, 5e-4};
// Central differences of a double reference with step kDoubleStep: truncation ~1e-12 and
// rounding ~1e-10, so what is left is the fp32 rounding of the analytic backward itself
// (largest seen 1.5e-7).
constexpr double kDoubleStep = 1e-6;
constexpr Tolerance kDoubleGradTolerance{1e-6, 1e-5};
// Bit-identical: exact arithmetic on small integers, or the very same fp32 operation.
constexpr Tolerance kExact{0.0, 0.0};
// AdamW against a hand-computed step: a dozen fp32 roundings of O(1) values.
constexpr Tolerance kAdamWTolerance{1e-6, 1e-6};

constexpr int kBatch = 2;
constexpr int kSeq = 5;
constexpr int kChannels = 8;
constexpr int kHeads = 2;
constexpr int kVocab = 11;
constexpr int kRows = kBatch * kSeq;

std::vector<int32_t> random_ints(size_t elems, uint64_t seed, int32_t bound) {
  Rng rng(seed);
  std::vector<int32_t> values(elems);
  for (int32_t& value : values) value = static_cast<int32_t>(rng.next() % bound);
  return values;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& values) {
  return std::vector<double>(values.begin(), values.end());
}

template <class Real>
double weighted_sum(const std::vector<Real>& out, const std::vector<float>& weights) {
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i) total += static_cast<double>(out[i]) * weights[i];
  return total;
}

// dL/dx by central differences, perturbing x (fp32 or double) in place. The denominator
// is the step the arithmetic actually took, not the one that was asked for.
template <class Real, class Objective>
std::vector<double> central_differences(std::vector<Real>& x, Objective objective) {
  std::vector<double> gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const Real original = x[i];
    const Real step = std::is_same_v<Real, float>
                          ? static_cast<Real>(kFp32Step) * std::max(Real{1}, std::fabs(original))
                          : static_cast<Real>(kDoubleStep);
    const Real plus = original + step, minus = original - step;
    x[i] = plus;
    const double up = objective();
    x[i] = minus;
    const double down = objective();
    x[i] = original;
    gradient[i] = (up - down) / (static_cast<double>(plus) - static_cast<double>(minus));
  }
  return gradient;
}

// What a backward added on top of the random prior in its output buffer, against the
// central differences of objective with respect to x.
template <class Real, class Objective>
::testing::AssertionResult gradient_matches(const std::string& what,
                                            const std::vector<float>& after,
                                            const std::vector<float>& prior, std::vector<Real>& x,
                                            Objective objective, Tolerance tolerance) {
  std::vector<double> added(after.size());
  for (size_t i = 0; i < after.size(); ++i) added[i] = double{after[i]} - double{prior[i]};
  return all_close(what, added, central_differences(x, objective), tolerance);
}

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

void cross_entropy_reference(std::vector<double>& losses, std::vector<double>& probs,
                             const std::vector<double>& logits,
                             const std::vector<int32_t>& targets, int rows, int vocab) {
  losses.assign(rows, 0.0);
  probs.assign(static_cast<size_t>(rows) * vocab, 0.0);
  for (int n = 0; n < rows; ++n) {
    const double* row = logits.data() + static_cast<size_t>(n) * vocab;
    double max_logit = row[0];
    for (int v = 1; v < vocab; ++v) max_logit = std::max(max_logit, row[v]);
    double total = 0.0;
    for (int v = 0; v < vocab; ++v) total += std::exp(row[v] - max_logit);
    for (int v = 0; v < vocab; ++v) {
      probs[static_cast<size_t>(n) * vocab + v] = std::exp(row[v] - max_logit) / total;
    }
    losses[n] = std::log(total) + max_logit - row[targets[n]];
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
      ops.matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr,
                         kRows, in_channels, out_channels);
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
      ops.matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr,
                         kRows, in_channels, out_channels);
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

// ---- residual -----------------------------------------------------------------------

TEST(CpuOpsResidual, ForwardAndAccumulateAreExact) {
  CpuOps ops;
  std::vector<float> a = {1, -2, 3, 4.5f, 0.25f}, b = {10, 20, -30, 0.5f, 0.75f};
  const std::vector<float> expected = {11, 18, -27, 5, 1};
  std::vector<float> out(a.size());
  ops.residual_forward(out.data(), a.data(), b.data(), a.size());
  EXPECT_TRUE(all_close("residual", out, expected, kExact));
  ops.accumulate(a.data(), b.data(), a.size());
  EXPECT_TRUE(all_close("accumulate", a, expected, kExact));
}

// The header defines the residual backward as accumulate(d_input, dout) for each input.
TEST(CpuOpsResidual, BackwardMatchesFiniteDifferences) {
  CpuOps ops;
  auto a = random_floats(kRows * kChannels, 40), b = random_floats(a.size(), 41);
  auto r = random_floats(a.size(), 42);
  std::vector<float> out(a.size());
  auto objective = [&] {
    ops.residual_forward(out.data(), a.data(), b.data(), a.size());
    return weighted_sum(out, r);
  };
  const auto da_prior = random_floats(a.size(), 43), db_prior = random_floats(b.size(), 44);
  auto da = da_prior, db = db_prior;
  ops.accumulate(da.data(), r.data(), r.size());
  ops.accumulate(db.data(), r.data(), r.size());
  EXPECT_TRUE(gradient_matches("da", da, da_prior, a, objective, kFp32GradTolerance));
  EXPECT_TRUE(gradient_matches("db", db, db_prior, b, objective, kFp32GradTolerance));
}

// ---- softmax cross-entropy ----------------------------------------------------------

// The softmax that the backward recomputes from row_stats: with loss_scale 1 the backward
// writes probs - onehot(target).
std::vector<float> probs_from_backward(CpuOps& ops, const std::vector<float>& logits,
                                       const std::vector<float>& row_stats,
                                       const std::vector<int32_t>& targets, int rows, int vocab) {
  std::vector<float> probs(logits.size(), -7.0f);  // overwritten, never read
  ops.softmax_cross_entropy_backward(probs.data(), logits.data(), row_stats.data(),
                                     targets.data(), rows, vocab, 1.0f);
  for (int n = 0; n < rows; ++n) probs[static_cast<size_t>(n) * vocab + targets[n]] += 1.0f;
  return probs;
}

TEST(CpuOpsCrossEntropy, ForwardHandValuesAndStability) {
  CpuOps ops;
  auto targets = random_ints(kRows, 45, kVocab);
  std::vector<float> losses(kRows), row_stats(2 * kRows);
  // Equal logits: every probability is 1/V and every loss log(V), at any offset.
  for (float offset : {0.0f, 1000.0f, -1000.0f}) {
    std::vector<float> logits(kRows * kVocab, offset);
    ops.softmax_cross_entropy_forward(losses.data(), row_stats.data(), logits.data(),
                                      targets.data(), kRows, kVocab);
    const auto probs = probs_from_backward(ops, logits, row_stats, targets, kRows, kVocab);
    EXPECT_TRUE(all_close("uniform probs", probs,
                          std::vector<double>(probs.size(), 1.0 / kVocab), kForwardTolerance));
    EXPECT_TRUE(all_close("uniform losses", losses,
                          std::vector<double>(kRows, std::log(kVocab)), kForwardTolerance));
  }
  // Against the double reference, for ordinary logits and for logits spread over hundreds,
  // where fp32 exp overflows without the row max and target probabilities underflow to 0,
  // yet the losses must stay finite and accurate.
  for (float spread : {4.0f, 300.0f}) {
    auto logits = random_floats(kRows * kVocab, 46, -spread, spread);
    ops.softmax_cross_entropy_forward(losses.data(), row_stats.data(), logits.data(),
                                      targets.data(), kRows, kVocab);
    std::vector<double> ref_losses, ref_probs, row_sums(kRows, 0.0), ref_max(kRows);
    cross_entropy_reference(ref_losses, ref_probs, to_double(logits), targets, kRows, kVocab);
    const std::string label = " (logits within +-" + std::to_string(int(spread)) + ")";
    EXPECT_TRUE(all_close("losses" + label, losses, ref_losses, kForwardTolerance));
    std::vector<float> maxima(kRows);
    for (int n = 0; n < kRows; ++n) {
      maxima[n] = row_stats[2 * n];
      ref_max[n] = *std::max_element(logits.begin() + n * kVocab, logits.begin() + (n + 1) * kVocab);
    }
    EXPECT_TRUE(all_close("row maxima" + label, maxima, ref_max, kExact));
    const auto probs = probs_from_backward(ops, logits, row_stats, targets, kRows, kVocab);
    EXPECT_TRUE(all_close("probs" + label, probs, ref_probs, kForwardTolerance));
    for (size_t i = 0; i < probs.size(); ++i) row_sums[i / kVocab] += probs[i];
    EXPECT_TRUE(all_close("probs row sums" + label, row_sums, std::vector<double>(kRows, 1.0),
                          kForwardTolerance));
  }
}

TEST(CpuOpsCrossEntropy, BackwardMatchesFiniteDifferencesAndRunsInPlace) {
  CpuOps ops;
  auto targets = random_ints(kRows, 49, kVocab);
  auto logits = random_floats(kRows * kVocab, 50, -4.0f, 4.0f);
  const float loss_scale = 0.37f;  // not 1, so a dropped or doubled scale shows
  std::vector<float> losses(kRows), row_stats(2 * kRows);
  ops.softmax_cross_entropy_forward(losses.data(), row_stats.data(), logits.data(),
                                    targets.data(), kRows, kVocab);
  // The backward writes: whatever dlogits held before is gone.
  const std::vector<float> zeros(logits.size(), 0.0f);
  auto dlogits = random_floats(logits.size(), 51);
  ops.softmax_cross_entropy_backward(dlogits.data(), logits.data(), row_stats.data(),
                                     targets.data(), kRows, kVocab, loss_scale);
  std::vector<double> logits_double = to_double(logits), ref_losses, ref_probs;
  auto objective = [&] {
    cross_entropy_reference(ref_losses, ref_probs, logits_double, targets, kRows, kVocab);
    double total = 0.0;
    for (double loss : ref_losses) total += loss;
    return double{loss_scale} * total;
  };
  EXPECT_TRUE(gradient_matches("dlogits", dlogits, zeros, logits_double, objective,
                               kDoubleGradTolerance));
  // In place, as the classifier runs it: the same bits.
  auto in_place = logits;
  ops.softmax_cross_entropy_backward(in_place.data(), in_place.data(), row_stats.data(),
                                     targets.data(), kRows, kVocab, loss_scale);
  EXPECT_EQ(in_place, dlogits);
}

// The default classifier is the LM head's matmul followed by the cross-entropy, and its
// backward the cross-entropy's in place followed by the matmul's; given a loss scale, the
// forward runs the cross-entropy's backward too.
TEST(CpuOpsCrossEntropy, ClassifierIsMatmulThenCrossEntropy) {
  CpuOps ops;
  constexpr int kChannels = 6;
  const auto inp = random_floats(kRows * kChannels, 53);
  const auto weight = random_floats(kVocab * kChannels, 54);
  const auto targets = random_ints(kRows, 55, kVocab);
  const float loss_scale = 0.25f;
  std::vector<float> logits(kRows * kVocab), losses(kRows), row_stats(2 * kRows);
  ops.matmul_forward(logits.data(), inp.data(), weight.data(), nullptr, kRows, kChannels, kVocab);
  ops.softmax_cross_entropy_forward(losses.data(), row_stats.data(), logits.data(),
                                    targets.data(), kRows, kVocab);
  std::vector<float> dlogits(logits.size()), dinp(inp.size(), 0.5f), dweight(weight.size(), 0.5f);
  ops.softmax_cross_entropy_backward(dlogits.data(), logits.data(), row_stats.data(),
                                     targets.data(), kRows, kVocab, loss_scale);
  ops.matmul_backward({.dinp = dinp.data(), .dweight = dweight.data(), .dbias = nullptr,
                       .dout = dlogits.data(), .inp = inp.data(), .weight = weight.data(),
                       .rows = kRows, .in_channels = kChannels, .out_channels = kVocab,
                       .dinp_write = GradientWrite::accumulate});

  float* fused_logits = ops.allocate_logits(kRows, kVocab);
  std::vector<float> fused_losses(kRows), fused_stats(2 * kRows);
  std::vector<float> fused_dinp(inp.size(), 0.5f), fused_dweight(weight.size(), 0.5f);
  ops.classifier_forward({.losses = fused_losses.data(), .row_stats = fused_stats.data(),
                          .logits = fused_logits, .inp = inp.data(), .weight = weight.data(),
                          .targets = targets.data(), .rows = kRows, .channels = kChannels,
                          .vocab = kVocab, .dlogits_scale = std::nullopt});
  EXPECT_EQ(fused_losses, losses);
  EXPECT_EQ(std::vector<float>(fused_logits, fused_logits + logits.size()), logits);
  ops.classifier_backward({.dinp = fused_dinp.data(), .logits = fused_logits,
                           .row_stats = fused_stats.data(), .weight = weight.data(),
                           .targets = targets.data(), .rows = kRows, .channels = kChannels,
                           .vocab = kVocab, .loss_scale = loss_scale,
                           .dinp_write = GradientWrite::accumulate});
  EXPECT_EQ(std::vector<float>(fused_logits, fused_logits + logits.size()), dlogits);
  EXPECT_EQ(fused_dinp, dinp);
  ops.classifier_weight_backward({.dweight = fused_dweight.data(), .dlogits = fused_logits,
                                  .inp = inp.data(), .rows = kRows, .channels = kChannels,
                                  .vocab = kVocab, .vocab_begin = 0, .vocab_end = kVocab});
  EXPECT_EQ(fused_dweight, dweight);

  // A training step's form: the forward leaves dlogits, the backward only multiplies.
  std::vector<float> early_losses(kRows), early_stats(2 * kRows);
  std::vector<float> early_dinp(inp.size(), 0.5f), early_dweight(weight.size(), 0.5f);
  ops.classifier_forward({.losses = early_losses.data(), .row_stats = early_stats.data(),
                          .logits = fused_logits, .inp = inp.data(), .weight = weight.data(),
                          .targets = targets.data(), .rows = kRows, .channels = kChannels,
                          .vocab = kVocab, .dlogits_scale = loss_scale});
  EXPECT_EQ(early_losses, losses);
  EXPECT_EQ(early_stats, row_stats);
  EXPECT_EQ(std::vector<float>(fused_logits, fused_logits + logits.size()), dlogits);
  ops.classifier_backward_from_dlogits({.dinp = early_dinp.data(), .dlogits = fused_logits,
                                        .weight = weight.data(), .rows = kRows,
                                        .channels = kChannels, .vocab = kVocab,
                                        .dinp_write = GradientWrite::accumulate});
  EXPECT_EQ(early_dinp, dinp);
  // The weight gradient in parts, from the last rows down as the model takes it: each
  // row's bits are those of the whole range.
  ops.classifier_weight_backward({.dweight = early_dweight.data(), .dlogits = fused_logits,
                                  .inp = inp.data(), .rows = kRows, .channels = kChannels,
                                  .vocab = kVocab, .vocab_begin = 8, .vocab_end = kVocab});
  EXPECT_NE(early_dweight, dweight);
  ops.classifier_weight_backward({.dweight = early_dweight.data(), .dlogits = fused_logits,
                                  .inp = inp.data(), .rows = kRows, .channels = kChannels,
                                  .vocab = kVocab, .vocab_begin = 0, .vocab_end = 8});
  EXPECT_EQ(early_dweight, dweight);
  ops.release(fused_logits);
}

// ---- overwritten input gradients ----------------------------------------------------

// GradientWrite::overwrite is defined as accumulating into a zeroed buffer, without
// reading the buffer: run with a NaN-filled dinp, each op must give the zero-start
// accumulation's bits, in dinp and in the weight gradients alike.
template <class Op>
void expect_overwrite_is_accumulation_into_zeros(const std::string& what, size_t dinp_elems,
                                                 size_t dparam_elems, Op op) {
  std::vector<float> from_zero(dinp_elems, 0.0f), dparams_accumulated(dparam_elems, 0.25f);
  op(from_zero.data(), dparams_accumulated.data(), GradientWrite::accumulate);
  std::vector<float> from_nan(dinp_elems, std::nanf("")), dparams_overwritten(dparam_elems, 0.25f);
  op(from_nan.data(), dparams_overwritten.data(), GradientWrite::overwrite);
  EXPECT_EQ(from_nan, from_zero) << what << ": dinp";
  EXPECT_EQ(dparams_overwritten, dparams_accumulated) << what << ": the weight gradients";
  // And accumulate does read: a NaN start stays NaN, or the check above proves nothing.
  std::vector<float> nan_accumulated(dinp_elems, std::nanf("")), dparams(dparam_elems, 0.25f);
  op(nan_accumulated.data(), dparams.data(), GradientWrite::accumulate);
  EXPECT_TRUE(std::isnan(nan_accumulated[0])) << what;
}

TEST(CpuOpsGradientWrite, OverwriteEqualsAccumulatingIntoZeros) {
  CpuOps ops;
  const auto inp = random_floats(kRows * kChannels, 60);
  const auto dout = random_floats(kRows * 3 * kChannels, 61);
  const auto weight = random_floats(3 * kChannels * kChannels, 62);
  const auto ln_weight = random_floats(kChannels, 63);
  std::vector<float> normed(kRows * kChannels), mean(kRows), rstd(kRows);
  ops.layernorm_forward({.out = normed.data(), .mean = mean.data(), .rstd = rstd.data(),
                         .inp = inp.data(), .weight = ln_weight.data(), .bias = ln_weight.data(),
                         .rows = kRows, .channels = kChannels});
  expect_overwrite_is_accumulation_into_zeros(
      "layernorm", inp.size(), 2 * kChannels, [&](float* dinp, float* dparams, GradientWrite w) {
        ops.layernorm_backward({.dinp = dinp, .dweight = dparams, .dbias = dparams + kChannels,
                                .dout = dout.data(), .inp = inp.data(), .weight = ln_weight.data(),
                                .mean = mean.data(), .rstd = rstd.data(), .rows = kRows,
                                .channels = kChannels, .dinp_write = w});
      });
  expect_overwrite_is_accumulation_into_zeros(
      "matmul", inp.size(), weight.size() + 3 * kChannels,
      [&](float* dinp, float* dparams, GradientWrite w) {
        ops.matmul_backward({.dinp = dinp, .dweight = dparams, .dbias = dparams + weight.size(),
                             .dout = dout.data(), .inp = inp.data(), .weight = weight.data(),
                             .rows = kRows, .in_channels = kChannels, .out_channels = 3 * kChannels,
                             .dinp_write = w});
      });
  expect_overwrite_is_accumulation_into_zeros(
      "gelu", inp.size(), 0, [&](float* dinp, float*, GradientWrite w) {
        ops.gelu_backward(dinp, inp.data(), dout.data(), inp.size(), w);
      });
  const AttentionShape shape{kBatch, kSeq, kChannels, kHeads, true};
  const auto qkv = random_floats(kRows * 3 * kChannels, 64);
  std::vector<float> out(kRows * kChannels), probs(kBatch * kHeads * kSeq * kSeq);
  ops.attention_forward(out.data(), probs.data(), qkv.data(), shape);
  expect_overwrite_is_accumulation_into_zeros(
      "attention", qkv.size(), 0, [&](float* dqkv, float*, GradientWrite w) {
        ops.attention_backward(dqkv, dout.data(), qkv.data(), out.data(), probs.data(), shape, w);
      });
  const auto targets = random_ints(kRows, 65, kVocab);
  const auto lm_weight = random_floats(kVocab * kChannels, 66);
  expect_overwrite_is_accumulation_into_zeros(
      "classifier", inp.size(), lm_weight.size(), [&](float* dinp, float* dparams, GradientWrite w) {
        float* logits = ops.allocate_logits(kRows, kVocab);
        std::vector<float> losses(kRows), stats(2 * kRows);
        ops.classifier_forward({.losses = losses.data(), .row_stats = stats.data(),
                                .logits = logits, .inp = inp.data(), .weight = lm_weight.data(),
                                .targets = targets.data(), .rows = kRows, .channels = kChannels,
                                .vocab = kVocab, .dlogits_scale = std::nullopt});
        ops.classifier_backward({.dinp = dinp, .logits = logits, .row_stats = stats.data(),
                                 .weight = lm_weight.data(), .targets = targets.data(),
                                 .rows = kRows, .channels = kChannels, .vocab = kVocab,
                                 .loss_scale = 0.5f, .dinp_write = w});
        ops.classifier_weight_backward({.dweight = dparams, .dlogits = logits, .inp = inp.data(),
                                        .rows = kRows, .channels = kChannels, .vocab = kVocab,
                                        .vocab_begin = 0, .vocab_end = kVocab});
        ops.release(logits);
      });
}

// ---- reductions and optimizer -------------------------------------------------------

// 2^24 followed by ones: an fp32 running sum never moves off 2^24, a double one is exact.
TEST(CpuOpsReductions, SumsAccumulateInDouble) {
  CpuOps ops;
  std::vector<float> values = {16777216.0f, 1, 1, 1, 1}, roots = {4096.0f, 1, -1, 1, -1};
  EXPECT_EQ(ops.sum(values.data(), values.size()), 16777220.0);
  EXPECT_EQ(ops.sum_of_squares(roots.data(), roots.size()), 16777220.0);
  auto x = random_floats(1000, 52);
  double total = 0.0, squares = 0.0;
  for (float value : x) total += value, squares += double{value} * value;
  EXPECT_EQ(ops.sum(x.data(), x.size()), total);
  EXPECT_EQ(ops.sum_of_squares(x.data(), x.size()), squares);
}

TEST(CpuOpsReductions, ScaleMultipliesInPlace) {
  CpuOps ops;
  auto x = random_floats(33, 53);
  std::vector<float> expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) expected[i] = x[i] * 0.3f;
  ops.scale(x.data(), x.size(), 0.3f);
  EXPECT_TRUE(all_close("scale", x, expected, kExact));
}

TEST(CpuOpsAdamW, MatchesHandComputedSteps) {
  CpuOps ops;
  AdamWParams hyper{0.1f, 0.9f, 0.95f, 1e-8f, 0.01f, 1};
  // Step 1 from zero state, p=1, g=0.5: m=0.05, v=0.0125, mhat=0.5, vhat=0.25,
  //   p = 1 - 0.1*(0.5/(0.5+1e-8) + 0.01*1) = 0.899000002.
  // Step 3 from m=0.2, v=0.04, p=2, g=-0.4: m = 0.18-0.04 = 0.14, v = 0.038+0.008 = 0.046,
  //   mhat = 0.14/(1-0.9^3), vhat = 0.046/(1-0.95^3),
  //   p = 2 - 0.1*(mhat/(sqrt(vhat)+1e-8) + 0.01*2) = 1.9070343033139405.
  struct Case {
    int step;
    float param, grad, m, v;
    double param_after, m_after, v_after;
  };
  for (const Case& c : {Case{1, 1.0f, 0.5f, 0.0f, 0.0f, 0.899000002, 0.05, 0.0125},
                        Case{3, 2.0f, -0.4f, 0.2f, 0.04f, 1.9070343033139405, 0.14, 0.046}}) {
    hyper.step = c.step;
    std::vector<float> state = {c.param, c.m, c.v};
    ops.adamw_update(&state[0], &c.grad, &state[1], &state[2], 1, hyper);
    EXPECT_TRUE(all_close("param, m, v at step " + std::to_string(c.step), state,
                          std::vector<double>{c.param_after, c.m_after, c.v_after},
                          kAdamWTolerance));
  }
}

// The pieces' step is adamw_update piece by piece, each with its own weight decay: the
// hand-computed step above with decay 0.01 on the first element, none on the second.
TEST(CpuOpsAdamW, PiecesTakeTheirOwnWeightDecay) {
  CpuOps ops;
  AdamWParams hyper{0.1f, 0.9f, 0.95f, 1e-8f, /*weight_decay=*/0.7f, 1};
  std::vector<float> params = {1.0f, 1.0f}, grads = {0.5f, 0.5f}, m = {0, 0}, v = {0, 0};
  const std::vector<AdamWPiece> pieces = {{0, 1, 0.01f}, {1, 1, 0.5f}, {1, 2, 0.0f}};
  EXPECT_FALSE(ops.adamw_update_pieces(params.data(), grads.data(), m.data(), v.data(), pieces, hyper))
      << "the CPU keeps no compute copy";
  // p = 1 - 0.1*(0.5/(0.5+1e-8) + wd*1): 0.899000002 with decay 0.01, 0.900000002 without.
  EXPECT_TRUE(all_close("params", params, std::vector<double>{0.899000002, 0.900000002}, kAdamWTolerance));
}

}  // namespace
}  // namespace scalestudy
