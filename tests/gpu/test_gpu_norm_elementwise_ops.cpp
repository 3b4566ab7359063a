// The embedding, LayerNorm, GELU, accumulate, scale and fill ops of the CUDA backend
// against the CPU reference, in fp32, bf16 and fp16, at the op shapes and at GPT-2's widths.
#include <initializer_list>
#include <utility>

#include "cuda_ops_fixture.h"

namespace scalestudy::gpu_test {
namespace {

TEST_P(CudaOpsShapes, Embedding) {
  const OpShape s = shape();
  const size_t N = s.rows(), C = s.channels;
  const auto tokens = random_ids(N, 10, s.vocab);
  // The GPU reads the tables' storage copy: the CPU adds the same rounded values, in fp32.
  const auto master_wte = random_floats(s.vocab * C, 11), master_wpe = random_floats(s.seq * C, 12);
  const auto wte = rounded(master_wte), wpe = rounded(master_wpe);
  std::vector<float> out(N * C);
  float* d_out = poisoned_activation(out.size());
  const int32_t* d_tokens = upload(tokens);
  cpu_.embedding_forward({.out = out.data(), .tokens = tokens.data(), .wte = wte.data(),
                          .wpe = wpe.data(), .batch = s.batch, .seq = s.seq, .channels = s.channels});
  gpu_->embedding_forward({.out = d_out, .tokens = d_tokens, .wte = parameters(master_wte),
                           .wpe = parameters(master_wpe), .batch = s.batch, .seq = s.seq,
                           .channels = s.channels});
  expect_close("embedding out", d_out, rounded(out), kBitExact);

  const auto dout = rounded(random_floats(N * C, 13));
  auto dwte = random_floats(wte.size(), 14), dwpe = random_floats(wpe.size(), 15);
  float *d_dwte = upload(dwte), *d_dwpe = upload(dwpe);
  cpu_.embedding_backward({.dwte = dwte.data(), .dwpe = dwpe.data(), .dout = dout.data(),
                           .tokens = tokens.data(), .batch = s.batch, .seq = s.seq,
                           .channels = s.channels});
  gpu_->embedding_backward({.dwte = d_dwte, .dwpe = d_dwpe, .dout = activation(dout),
                            .tokens = d_tokens, .batch = s.batch, .seq = s.seq,
                            .channels = s.channels});
  expect_close("dwte (repeated tokens)", d_dwte, dwte, kBitExact);
  expect_close("dwpe", d_dwpe, dwpe, kBitExact);
}

TEST_P(CudaOpsShapes, LayerNorm) { check_layernorm(shape().rows(), shape().channels, ""); }

// In fp32 a row stays in registers up to 1024 channels (8 packs of 4 per lane): GPT-2
// small's and medium's widths take that path, 1032 the block-per-row one. 70 rows leave
// the backward's last chunk of 32 rows partly empty.
TEST_F(CudaOpsTest, LayerNormAtModelWidths) {
  for (int channels : {768, 1024, 1032})
    check_layernorm(70, channels, " (C=" + std::to_string(channels) + ")");
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

// The backward's partial rows over many rows. At 768 channels the warp kernel's blocks
// take 32 rows, 64 beyond 16384 rows and 128 beyond 32768; at 2056 the block-per-row
// kernels' parameter partials take chunks of 64 rows. Rows a few past each step leave the
// last block or chunk partly empty. The parameter gradients are held to double sums
// (kManyRowColumnSum), dinp to the CPU's.
TEST_P(CudaOpsHalf, LayerNormBackwardPartialsOverManyRows) {
  for (const auto& [N, C] :
       std::initializer_list<std::pair<int, int>>{{16400, 768}, {32800, 768}, {32800, 2056}}) {
    const std::string label = " (rows=" + std::to_string(N) + ", C=" + std::to_string(C) + ")";
    const auto inp = rounded(random_floats(size_t(N) * C, 20, -3.0f, 5.0f));
    // The GPU reads the parameters' 16-bit copy, the CPU the same rounded values.
    const auto master_weight = random_floats(C, 21, 0.5f, 1.5f);
    const auto weight = rounded(master_weight), bias = rounded(random_floats(C, 22));
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    cpu_.layernorm_forward({.out = out.data(), .mean = mean.data(), .rstd = rstd.data(),
                            .inp = inp.data(), .weight = weight.data(), .bias = bias.data(),
                            .rows = N, .channels = C});
    const auto dout = rounded(random_floats(inp.size(), 23));
    // dinp against the CPU's, element by element: a row that no block took keeps its poison.
    std::vector<float> dinp(inp.size()), cpu_dweight(C), cpu_dbias(C);
    cpu_.layernorm_backward({.dinp = dinp.data(), .dweight = cpu_dweight.data(),
                             .dbias = cpu_dbias.data(), .dout = dout.data(), .inp = inp.data(),
                             .weight = weight.data(), .mean = mean.data(), .rstd = rstd.data(),
                             .rows = N, .channels = C,
                             .dinp_write = GradientWrite::overwrite});
    float* d_dinp = poisoned_activation(inp.size());
    float* d_dweight = upload(std::vector<float>(C, 0.0f));
    float* d_dbias = upload(std::vector<float>(C, 0.0f));
    gpu_->layernorm_backward({.dinp = d_dinp, .dweight = d_dweight, .dbias = d_dbias,
                              .dout = activation(dout), .inp = activation(inp),
                              .weight = parameters(master_weight), .mean = upload(mean),
                              .rstd = upload(rstd), .rows = N, .channels = C,
                              .dinp_write = GradientWrite::overwrite});
    expect_close("layernorm dinp" + label, d_dinp, dinp, tol_.rounding);
    std::vector<double> weight_sums(C, 0.0);
    for (int r = 0; r < N; ++r) {
      for (int c = 0; c < C; ++c) {
        const size_t at = size_t(r) * C + c;
        weight_sums[c] += (double{inp[at]} - mean[r]) * rstd[r] * dout[at];
      }
    }
    expect_close("layernorm dweight" + label, d_dweight,
                 std::vector<float>(weight_sums.begin(), weight_sums.end()), kManyRowColumnSum);
    expect_close("layernorm dbias" + label, d_dbias, double_column_sums(dout, N, C),
                 kManyRowColumnSum);
  }
}

TEST_P(CudaOpsShapes, Gelu) {
  const OpShape s = shape();
  const size_t elems = size_t(s.rows()) * 4 * s.channels + 5;  // +5: a ragged tail
  const auto inp = rounded(random_floats(elems, 50, -5.0f, 5.0f));
  std::vector<float> out(elems);
  float* d_out = poisoned_activation(elems);
  const float* d_inp = activation(inp);
  cpu_.gelu_forward(out.data(), inp.data(), elems);
  gpu_->gelu_forward(d_out, d_inp, elems);
  // fp32: kGeluForward, the same bound as tol_.rounding's.
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

TEST_P(CudaOpsShapes, Accumulate) {
  const OpShape s = shape();
  const size_t elems = size_t(s.rows()) * s.channels + 3;  // +3: a ragged tail
  auto dst = rounded(random_floats(elems, 60));
  const auto src = rounded(random_floats(elems, 61));
  float* d_dst = activation(dst);
  cpu_.accumulate(dst.data(), src.data(), elems);
  gpu_->accumulate(d_dst, activation(src), elems);
  expect_close("accumulate", d_dst, rounded(dst), kBitExact);
}

// scale and fill_zero take fp32 buffers (gradients) in every precision.
TEST_P(CudaOpsShapes, ScaleAndFillZero) {
  const OpShape s = shape();
  const size_t elems = size_t(s.rows()) * s.channels + 3;  // +3: a ragged tail
  auto x = random_floats(elems, 62);
  float* d_x = upload(x);
  cpu_.scale(x.data(), elems, 0.37f);
  gpu_->scale(d_x, elems, 0.37f);
  expect_close("scale", d_x, x, kBitExact);
  cpu_.fill_zero(x.data(), elems - 1);
  gpu_->fill_zero(d_x, elems - 1);
  expect_close("fill_zero", d_x, x, kBitExact);
}

SCALESTUDY_SHAPE_TESTS();
SCALESTUDY_HALF_PRECISION_TESTS();

}  // namespace
}  // namespace scalestudy::gpu_test
