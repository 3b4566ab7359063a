// The CPU backend's cross-entropy, classifier, input-gradient writes, reductions and
// AdamW, against hand-computed values, a double-precision reference and central finite
// differences (cpu_ops_checks.h); test_cpu_ops.cpp holds the layers' ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "cpu_ops_checks.h"

namespace scalestudy {
namespace {

using namespace cpu_ops_test;

// ---- double-precision reference ----------------------------------------------------

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
  ops.matmul_forward({.out = logits.data(), .inp = inp.data(), .weight = weight.data(),
                      .rows = kRows, .in_channels = kChannels, .out_channels = kVocab});
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
