// The dense layer and GELU pair of the op interface (Ops::dense_gelu_forward and
// Ops::dense_backward_through_gelu) on the CPU backend, which keeps their defaults: the
// same bits as the plain ops they compose, so the oracle's model step is unchanged by
// them. Outputs that the pair writes start as NaN, which proves they are never read; the
// parameter gradients start from a random prior, which proves they accumulate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace scalestudy {
namespace {

constexpr int kRows = 10;
constexpr int kChannels = 8;
constexpr int kHidden = 4 * kChannels;

// splitmix64: the same inputs with every compiler and standard library.
std::vector<float> random_floats(size_t elems, uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  std::vector<float> values(elems);
  uint64_t state = seed;
  for (float& value : values) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    value = lo + (hi - lo) * static_cast<float>(static_cast<double>(z >> 40) * 0x1.0p-24);
  }
  return values;
}

std::vector<float> nans(size_t elems) { return std::vector<float>(elems, std::nanf("")); }

// The first dense layer of the MLP (C -> 4C) with and without a bias: pre is the plain
// matmul's output and out the GELU of it.
TEST(DenseGeluOps, ForwardIsTheMatmulThenTheGelu) {
  CpuOps ops;
  const auto inp = random_floats(kRows * kChannels, 1);
  const auto weight = random_floats(kHidden * kChannels, 2, -0.5f, 0.5f);
  const auto bias = random_floats(kHidden, 3);
  for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
    std::vector<float> pre(kRows * kHidden), out(pre.size());
    ops.matmul_forward({.out = pre.data(), .inp = inp.data(), .weight = weight.data(), .bias = b,
                        .rows = kRows, .in_channels = kChannels, .out_channels = kHidden});
    ops.gelu_forward(out.data(), pre.data(), pre.size());

    auto fused_pre = nans(pre.size()), fused_out = nans(pre.size());
    ops.dense_gelu_forward({.pre = fused_pre.data(), .out = fused_out.data(), .inp = inp.data(),
                            .weight = weight.data(), .bias = b, .rows = kRows,
                            .in_channels = kChannels, .out_channels = kHidden});
    EXPECT_EQ(fused_pre, pre) << (b != nullptr ? "with bias" : "without bias");
    EXPECT_EQ(fused_out, out) << (b != nullptr ? "with bias" : "without bias");
  }
}

// The second dense layer (4C -> C) backward through the GELU: the input gradient that the
// plain matmul backward writes, put through the GELU's backward, both overwriting; the
// parameter gradients accumulate exactly as the matmul backward's do.
TEST(DenseGeluOps, BackwardThroughGeluIsTheMatmulBackwardThenTheGeluBackward) {
  CpuOps ops;
  const auto pre = random_floats(kRows * kHidden, 4, -4.0f, 4.0f);
  std::vector<float> act(pre.size());
  ops.gelu_forward(act.data(), pre.data(), pre.size());
  const auto dout = random_floats(kRows * kChannels, 5);
  const auto weight = random_floats(kChannels * kHidden, 6, -0.5f, 0.5f);
  const auto dweight_prior = random_floats(weight.size(), 7);
  const auto dbias_prior = random_floats(kChannels, 8);
  for (bool with_bias : {true, false}) {
    const char* label = with_bias ? "with bias" : "without bias";
    std::vector<float> dact(pre.size()), dpre(pre.size());
    auto dweight = dweight_prior, dbias = dbias_prior;
    ops.matmul_backward({.dinp = dact.data(), .dweight = dweight.data(),
                         .dbias = with_bias ? dbias.data() : nullptr, .dout = dout.data(),
                         .inp = act.data(), .weight = weight.data(), .rows = kRows,
                         .in_channels = kHidden, .out_channels = kChannels,
                         .dinp_write = GradientWrite::overwrite});
    ops.gelu_backward(dpre.data(), pre.data(), dact.data(), pre.size(), GradientWrite::overwrite);

    auto fused_dpre = nans(pre.size()), scratch = nans(pre.size());
    auto fused_dweight = dweight_prior, fused_dbias = dbias_prior;
    ops.dense_backward_through_gelu({.dpre = fused_dpre.data(), .dweight = fused_dweight.data(),
                                     .dbias = with_bias ? fused_dbias.data() : nullptr,
                                     .dout = dout.data(), .act = act.data(), .pre = pre.data(),
                                     .weight = weight.data(), .rows = kRows, .in_channels = kHidden,
                                     .out_channels = kChannels, .dact_scratch = scratch.data()});
    EXPECT_EQ(fused_dpre, dpre) << label;
    EXPECT_EQ(fused_dweight, dweight) << label;
    EXPECT_EQ(fused_dbias, dbias) << label;
    if (!with_bias) {
      EXPECT_EQ(fused_dbias, dbias_prior) << "no bias, no bias gradient";
    }
  }
}

// The pair is one MLP: the backward through the GELU, followed by the first layer's
// matmul backward, is the plain ops' backward of the whole MLP, and the forward's pre and
// out are what that backward reads.
TEST(DenseGeluOps, TheMlpThroughThePairIsTheMlpThroughThePlainOps) {
  CpuOps ops;
  const auto inp = random_floats(kRows * kChannels, 9);
  const auto fc_weight = random_floats(kHidden * kChannels, 10, -0.5f, 0.5f);
  const auto fc_bias = random_floats(kHidden, 11, -0.5f, 0.5f);
  const auto proj_weight = random_floats(kChannels * kHidden, 12, -0.5f, 0.5f);
  const auto proj_bias = random_floats(kChannels, 13, -0.5f, 0.5f);
  const auto dout = random_floats(kRows * kChannels, 14);
  struct Result {
    std::vector<float> out, dinp, d_fc_weight, d_fc_bias, d_proj_weight, d_proj_bias;
  };
  auto mlp = [&](bool pair) {
    Result r{std::vector<float>(kRows * kChannels), nans(kRows * kChannels),
             std::vector<float>(fc_weight.size(), 0.5f), std::vector<float>(kHidden, 0.5f),
             std::vector<float>(proj_weight.size(), 0.5f), std::vector<float>(kChannels, 0.5f)};
    auto pre = nans(kRows * kHidden), act = nans(pre.size()), dpre = nans(pre.size());
    auto dact = nans(pre.size());
    if (pair) {
      ops.dense_gelu_forward({.pre = pre.data(), .out = act.data(), .inp = inp.data(),
                              .weight = fc_weight.data(), .bias = fc_bias.data(), .rows = kRows,
                              .in_channels = kChannels, .out_channels = kHidden});
    } else {
      ops.matmul_forward({.out = pre.data(), .inp = inp.data(), .weight = fc_weight.data(),
                          .bias = fc_bias.data(), .rows = kRows, .in_channels = kChannels,
                          .out_channels = kHidden});
      ops.gelu_forward(act.data(), pre.data(), pre.size());
    }
    ops.matmul_forward({.out = r.out.data(), .inp = act.data(), .weight = proj_weight.data(),
                        .bias = proj_bias.data(), .rows = kRows, .in_channels = kHidden,
                        .out_channels = kChannels});
    if (pair) {
      ops.dense_backward_through_gelu({.dpre = dpre.data(), .dweight = r.d_proj_weight.data(),
                                       .dbias = r.d_proj_bias.data(), .dout = dout.data(),
                                       .act = act.data(), .pre = pre.data(),
                                       .weight = proj_weight.data(), .rows = kRows,
                                       .in_channels = kHidden, .out_channels = kChannels,
                                       .dact_scratch = dact.data()});
    } else {
      ops.matmul_backward({.dinp = dact.data(), .dweight = r.d_proj_weight.data(),
                           .dbias = r.d_proj_bias.data(), .dout = dout.data(), .inp = act.data(),
                           .weight = proj_weight.data(), .rows = kRows, .in_channels = kHidden,
                           .out_channels = kChannels, .dinp_write = GradientWrite::overwrite});
      ops.gelu_backward(dpre.data(), pre.data(), dact.data(), pre.size(),
                        GradientWrite::overwrite);
    }
    ops.matmul_backward({.dinp = r.dinp.data(), .dweight = r.d_fc_weight.data(),
                         .dbias = r.d_fc_bias.data(), .dout = dpre.data(), .inp = inp.data(),
                         .weight = fc_weight.data(), .rows = kRows, .in_channels = kChannels,
                         .out_channels = kHidden, .dinp_write = GradientWrite::overwrite});
    return r;
  };
  const Result plain = mlp(false), paired = mlp(true);
  EXPECT_EQ(paired.out, plain.out);
  EXPECT_EQ(paired.dinp, plain.dinp);
  EXPECT_EQ(paired.d_fc_weight, plain.d_fc_weight);
  EXPECT_EQ(paired.d_fc_bias, plain.d_fc_bias);
  EXPECT_EQ(paired.d_proj_weight, plain.d_proj_weight);
  EXPECT_EQ(paired.d_proj_bias, plain.d_proj_bias);
}

}  // namespace
}  // namespace scalestudy
