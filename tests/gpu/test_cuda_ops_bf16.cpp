// The CUDA backend in its two 16-bit modes, bf16 and fp16, against the fp32 CPU reference:
// every op, a whole model step, and the 16-bit memory rules (storage sizes, conversions,
// the parameters' 16-bit copy and its refresh), each test once per precision
// (CudaOpsHalf*/bf16..., CudaOpsHalf*/fp16...); then fp16's range (overflow to inf, never
// clamped, and its way into the gradient norm). GPT-2-sized checks, the cuBLASLt epilogues
// and the timings are in test_cuda_ops_half_gpt2.cpp; the tolerances and the fixture in
// cuda_ops_half_fixture.h. (The file keeps its bf16 name: jobscripts/gpu_check.sh runs it
// by name.)
#include "cuda_ops_half_fixture.h"

namespace scalestudy::gpu_test {
namespace {

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
  // because the 16-bit forward reads it from the copy too, in cuBLASLt's epilogue or in the
  // bias kernel.)
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

// Every op that reads a parameter reads the 16-bit copy, never the fp32 master: zero2
// gathers only the copy, so the masters of other ranks' chunks are stale while it trains.
// Each op runs once with the masters as refreshed and once with them overwritten by NaN
// (not announced): the results must be the same bits.
TEST_P(CudaOpsHalf, OpsReadTheParameterCopyNotTheMasters) {
  const int B = 2, T = 8, C = 64, V = 40;
  const int N = B * T;
  // One allocation, as the model's: wte, wpe, LayerNorm weight and bias, and a dense
  // layer's weight and bias of OC outputs. OC = 20 is not a multiple of 8, so its bias is
  // added by the kernel that unpads the GEMM's rows; at 24 cuBLASLt's epilogue adds it
  // where it takes the shape, and the bias kernel otherwise.
  const int kDenseOutputs[] = {24, 20};
  const size_t wte_at = 0, wpe_at = size_t(V) * C, ln_w_at = wpe_at + size_t(T) * C, ln_b_at = ln_w_at + C;
  const size_t dense_w_at = ln_b_at + C, dense_b_at = dense_w_at + size_t(24) * C;
  const size_t param_elems = dense_b_at + 24;
  const auto masters = random_floats(param_elems, 31, 0.5f, 1.5f);
  float* d_params = parameters(masters);
  const float *wte = d_params + wte_at, *wpe = d_params + wpe_at;
  const float *ln_w = d_params + ln_w_at, *ln_b = d_params + ln_b_at;
  const auto tokens = random_ids(N, 32, V);
  const int32_t* d_tokens = upload(tokens);
  const float* d_inp = activation(rounded(random_floats(size_t(N) * C, 33, -3.0f, 3.0f)));
  const float* d_addend = activation(rounded(random_floats(size_t(N) * C, 34)));
  const float* d_dout = activation(rounded(random_floats(size_t(N) * C, 35)));

  auto run_all = [&] {
    std::vector<std::vector<float>> results;
    float* emb = poisoned_activation(size_t(N) * C);
    gpu_->embedding_forward({.out = emb, .tokens = d_tokens, .wte = wte, .wpe = wpe, .batch = B,
                             .seq = T, .channels = C});
    results.push_back(download(emb, size_t(N) * C));
    float *out = poisoned_activation(size_t(N) * C), *mean = poisoned(N), *rstd = poisoned(N);
    gpu_->layernorm_forward({.out = out, .mean = mean, .rstd = rstd, .inp = d_inp, .weight = ln_w,
                             .bias = ln_b, .rows = N, .channels = C});
    results.push_back(download(out, size_t(N) * C));
    float *sum = poisoned_activation(size_t(N) * C), *fused = poisoned_activation(size_t(N) * C);
    gpu_->residual_layernorm_forward({.residual = sum, .out = fused, .mean = mean, .rstd = rstd,
                                      .a = d_inp, .b = d_addend, .weight = ln_w, .bias = ln_b,
                                      .rows = N, .channels = C});
    results.push_back(download(fused, size_t(N) * C));
    float* dinp = poisoned_activation(size_t(N) * C);
    float *dweight = upload(std::vector<float>(C, 0.0f)), *dbias = upload(std::vector<float>(C, 0.0f));
    gpu_->layernorm_backward({.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = d_dout,
                              .inp = d_inp, .weight = ln_w, .mean = mean, .rstd = rstd, .rows = N,
                              .channels = C, .dinp_write = GradientWrite::overwrite});
    results.push_back(download(dinp, size_t(N) * C));
    for (int outputs : kDenseOutputs) {
      float* dense = poisoned_activation(size_t(N) * outputs);
      gpu_->matmul_forward(dense, d_inp, d_params + dense_w_at, d_params + dense_b_at, N, C, outputs);
      results.push_back(download(dense, size_t(N) * outputs));
    }
    return results;
  };
  const auto refreshed = run_all();
  gpu_->copy_from_host(d_params, std::vector<float>(param_elems, NAN).data(), param_elems);
  const auto stale_masters = run_all();
  const char* names[] = {"embedding out", "layernorm out", "residual + layernorm out", "layernorm dinp",
                         "dense 64->24 with bias", "dense 64->20 with bias"};
  for (size_t r = 0; r < refreshed.size(); ++r) {
    EXPECT_TRUE(std::none_of(refreshed[r].begin(), refreshed[r].end(), [](float v) { return std::isnan(v); }))
        << names[r];
    EXPECT_TRUE(all_close(std::string(names[r]) + " with NaN masters", stale_masters[r], refreshed[r], kBitExact));
  }
}

// ---- per-op comparisons -------------------------------------------------------------

TEST_P(CudaOpsHalfShapes, Embedding) {
  const OpShape s = shape();
  const size_t N = s.rows(), C = s.channels;
  const auto tokens = random_ids(N, 10, s.vocab);
  // The GPU reads the tables' 16-bit copy: the CPU adds the same rounded values, in fp32.
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

TEST_P(CudaOpsHalfShapes, LayerNorm) {
  const OpShape s = shape();
  check_layernorm(s.rows(), s.channels, "");
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
      cpu_.matmul_backward({.dinp = dinp.data(), .dweight = dweight.data(),
                            .dbias = c.bias ? dbias.data() : nullptr, .dout = dout.data(),
                            .inp = inp.data(), .weight = weight, .rows = N,
                            .in_channels = c.in_channels, .out_channels = c.out_channels,
                            .dinp_write = write});
      gpu_->matmul_backward({.dinp = d_dinp, .dweight = d_dweight,
                             .dbias = c.bias ? d_dbias : nullptr, .dout = activation(dout),
                             .inp = d_inp, .weight = d_params + weight_at, .rows = N,
                             .in_channels = c.in_channels, .out_channels = c.out_channels,
                             .dinp_write = write});
      expect_close("matmul dinp" + labels, d_dinp, dinp, gemm_tolerance(dinp));
      expect_close("matmul dweight" + labels, d_dweight, dweight, kFp32DotProduct);
      expect_close("matmul dbias" + labels, d_dbias, dbias, kColumnSum);
    }
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
  gpu_->matmul_backward({.dinp = plain_dinp, .dweight = plain_dweight, .dbias = nullptr,
                         .dout = plain_logits, .inp = d_inp, .weight = d_weight, .rows = N,
                         .in_channels = C, .out_channels = V,
                         .dinp_write = GradientWrite::accumulate});

  float* logits = gpu_->allocate_logits(N, V);
  owned_.push_back(logits);
  float *losses = statistics(N), *stats = statistics(2 * size_t(N));
  float *dinp = activation(dinp_prior), *dweight = upload(dweight_prior);
  gpu_->classifier_forward({.losses = losses, .row_stats = stats, .logits = logits, .inp = d_inp,
                            .weight = d_weight, .targets = d_targets, .rows = N, .channels = C,
                            .vocab = V, .dlogits_scale = std::nullopt});
  gpu_->classifier_backward({.dinp = dinp, .logits = logits, .row_stats = stats, .weight = d_weight,
                             .targets = d_targets, .rows = N, .channels = C, .vocab = V,
                             .loss_scale = loss_scale, .dinp_write = GradientWrite::accumulate});
  gpu_->classifier_weight_backward({.dweight = dweight, .dlogits = logits, .inp = d_inp, .rows = N,
                                    .channels = C, .vocab = V, .vocab_begin = 0, .vocab_end = V});
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
  cpu_.classifier_forward({.losses = cpu_losses.data(), .row_stats = cpu_stats.data(),
                           .logits = cpu_logits.data(), .inp = inp.data(), .weight = weight,
                           .targets = targets.data(), .rows = N, .channels = C, .vocab = V,
                           .dlogits_scale = std::nullopt});
  const double unit = precision_ == Precision::fp16 ? 0x1p-11 : 0x1p-8;
  expect_close("classifier losses vs cpu", losses, cpu_losses, Tolerance{2 * unit * max_abs(cpu_logits), 0.0});
  cpu_.classifier_backward({.dinp = cpu_dinp.data(), .logits = cpu_logits.data(),
                            .row_stats = cpu_stats.data(), .weight = weight,
                            .targets = targets.data(), .rows = N, .channels = C, .vocab = V,
                            .loss_scale = loss_scale, .dinp_write = GradientWrite::accumulate});
  cpu_.classifier_weight_backward({.dweight = cpu_dweight.data(), .dlogits = cpu_logits.data(),
                                   .inp = inp.data(), .rows = N, .channels = C, .vocab = V,
                                   .vocab_begin = 0, .vocab_end = V});
  expect_close("classifier dinp vs cpu", dinp, cpu_dinp, gemm_tolerance(cpu_dinp));

  // Overwriting, the padded path writes dinp = dlogits @ weight into a NaN buffer, which
  // it must never read: against the CPU's overwrite. dweight still accumulates, with the
  // plain path's bits.
  float* overwritten = poisoned_activation(inp.size());
  float* scratch_dweight = upload(dweight_prior);
  gpu_->classifier_forward({.losses = losses, .row_stats = stats, .logits = logits, .inp = d_inp,
                            .weight = d_weight, .targets = d_targets, .rows = N, .channels = C,
                            .vocab = V, .dlogits_scale = std::nullopt});
  gpu_->classifier_backward({.dinp = overwritten, .logits = logits, .row_stats = stats,
                             .weight = d_weight, .targets = d_targets, .rows = N, .channels = C,
                             .vocab = V, .loss_scale = loss_scale,
                             .dinp_write = GradientWrite::overwrite});
  gpu_->classifier_weight_backward({.dweight = scratch_dweight, .dlogits = logits, .inp = d_inp,
                                    .rows = N, .channels = C, .vocab = V, .vocab_begin = 0,
                                    .vocab_end = V});
  std::vector<float> cpu_overwritten(inp.size()), cpu_scratch_dweight = dweight_prior;
  cpu_.classifier_forward({.losses = cpu_losses.data(), .row_stats = cpu_stats.data(),
                           .logits = cpu_logits.data(), .inp = inp.data(), .weight = weight,
                           .targets = targets.data(), .rows = N, .channels = C, .vocab = V,
                           .dlogits_scale = std::nullopt});
  cpu_.classifier_backward({.dinp = cpu_overwritten.data(), .logits = cpu_logits.data(),
                            .row_stats = cpu_stats.data(), .weight = weight,
                            .targets = targets.data(), .rows = N, .channels = C, .vocab = V,
                            .loss_scale = loss_scale, .dinp_write = GradientWrite::overwrite});
  cpu_.classifier_weight_backward({.dweight = cpu_scratch_dweight.data(),
                                   .dlogits = cpu_logits.data(), .inp = inp.data(), .rows = N,
                                   .channels = C, .vocab = V, .vocab_begin = 0, .vocab_end = V});
  expect_close("classifier dinp vs cpu" + write_label(GradientWrite::overwrite), overwritten, cpu_overwritten,
               gemm_tolerance(cpu_overwritten));
  expect_close("classifier dweight, overwriting dinp, vs plain", scratch_dweight,
               download(plain_dweight, dweight_prior.size()), kBitExact);

  // A training step's form: the forward computes dlogits with the loss in one kernel, the
  // backward only multiplies. Its statistics may differ from the forward kernel's in the
  // last bits, so the reference is the plain path run from the statistics it wrote: the
  // same dlogits bits, hence the same GEMM results.
  float *early_losses = statistics(N), *early_stats = statistics(2 * size_t(N));
  float *early_dinp = activation(dinp_prior), *early_dweight = upload(dweight_prior);
  gpu_->classifier_forward({.losses = early_losses, .row_stats = early_stats, .logits = logits,
                            .inp = d_inp, .weight = d_weight, .targets = d_targets, .rows = N,
                            .channels = C, .vocab = V, .dlogits_scale = loss_scale});
  gpu_->classifier_backward_from_dlogits({.dinp = early_dinp, .dlogits = logits, .weight = d_weight,
                                          .rows = N, .channels = C, .vocab = V,
                                          .dinp_write = GradientWrite::accumulate});
  gpu_->classifier_weight_backward({.dweight = early_dweight, .dlogits = logits, .inp = d_inp,
                                    .rows = N, .channels = C, .vocab = V, .vocab_begin = 0,
                                    .vocab_end = V});
  expect_close("classifier with dlogits in forward: losses vs plain", early_losses, download(plain_losses, N),
               kSoftmax);
  expect_close("classifier with dlogits in forward: row statistics vs plain", early_stats,
               download(plain_stats, 2 * size_t(N)), kSoftmax);
  float* replay_logits = poisoned_activation(size_t(N) * V);
  float *replay_dinp = activation(dinp_prior), *replay_dweight = upload(dweight_prior);
  gpu_->matmul_forward(replay_logits, d_inp, d_weight, nullptr, N, C, V);
  gpu_->softmax_cross_entropy_backward(replay_logits, replay_logits, early_stats, d_targets, N, V, loss_scale);
  gpu_->matmul_backward({.dinp = replay_dinp, .dweight = replay_dweight, .dbias = nullptr,
                         .dout = replay_logits, .inp = d_inp, .weight = d_weight, .rows = N,
                         .in_channels = C, .out_channels = V,
                         .dinp_write = GradientWrite::accumulate});
  expect_close("classifier with dlogits in forward: dinp vs plain", early_dinp,
               download(replay_dinp, inp.size()), kBitExact);
  expect_close("classifier with dlogits in forward: dweight vs plain", early_dweight,
               download(replay_dweight, dweight_prior.size()), kBitExact);
  expect_close("classifier with dlogits in forward: dinp vs cpu", early_dinp, cpu_dinp,
               gemm_tolerance(cpu_dinp));

  // The weight gradient in parts, from the last rows down as the model takes it, ending
  // at rows 8 and (V / 16) * 8, against the whole range, both from zeros: a part's GEMMs may
  // sum in another order (fp32 rounding, far inside the GEMM tolerance), while a part
  // missed or taken twice is off by the whole gradient.
  const std::vector<float> zeros(dweight_prior.size(), 0.0f);
  float *whole_dweight = upload(zeros), *parts_dweight = upload(zeros);
  gpu_->classifier_weight_backward({.dweight = whole_dweight, .dlogits = logits, .inp = d_inp,
                                    .rows = N, .channels = C, .vocab = V, .vocab_begin = 0,
                                    .vocab_end = V});
  const int middle = V / 16 * 8;
  if (middle > 8) gpu_->classifier_weight_backward({.dweight = parts_dweight, .dlogits = logits,
                                                    .inp = d_inp, .rows = N, .channels = C,
                                                    .vocab = V, .vocab_begin = middle,
                                                    .vocab_end = V});
  gpu_->classifier_weight_backward({.dweight = parts_dweight, .dlogits = logits, .inp = d_inp,
                                    .rows = N, .channels = C, .vocab = V, .vocab_begin = 8,
                                    .vocab_end = middle > 8 ? middle : V});
  gpu_->classifier_weight_backward({.dweight = parts_dweight, .dlogits = logits, .inp = d_inp,
                                    .rows = N, .channels = C, .vocab = V, .vocab_begin = 0,
                                    .vocab_end = 8});
  const std::vector<float> whole = download(whole_dweight, zeros.size());
  ASSERT_GT(max_abs(whole), 0.0) << "an all-zero gradient would test nothing";
  expect_close("classifier dweight in parts vs the whole range", parts_dweight, whole, gemm_tolerance(whole));
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsHalfShapes,
                         ::testing::Combine(::testing::ValuesIn(kHalfPrecisions),
                                            ::testing::ValuesIn(kShapes)),
                         half_shape_test_name);

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
    FullGradient cpu_sink(cpu_grads.data());
    cpu_model.backward(cpu_sink, loss_scale);
    float* d_grads = upload(std::vector<float>(param_elems, 0.0f), MemoryKind::gradients);
    FullGradient gpu_sink(d_grads);
    gpu_model.backward(gpu_sink, loss_scale);
    const auto gpu_grads = download(d_grads, param_elems);

    // Every tensor's gradient within the norm-wise bound of the CPU's.
    auto check_gradients = [&](const std::vector<float>& grads, const std::string& form) {
      double worst = 0.0;
      std::string worst_name;
      for (const TensorSpec& tensor : layout.tensors) {
        double difference = 0.0, reference = 0.0;
        for (size_t i = tensor.offset_elems; i < tensor.offset_elems + tensor.elems; ++i) {
          const double delta = double{grads[i]} - double{cpu_grads[i]};
          difference += delta * delta;
          reference += double{cpu_grads[i]} * cpu_grads[i];
        }
        ASSERT_GT(reference, 0.0) << tensor.name << label << ": an all-zero gradient tests nothing";
        const double relative = std::sqrt(difference / reference);
        EXPECT_LE(relative, tol_.model_gradient_norm_relative) << "gradient of " << tensor.name << form << label;
        if (relative > worst) {
          worst = relative;
          worst_name = tensor.name;
        }
      }
      std::cout << "  gradients" << form << label << ": worst norm-wise relative error " << worst << " ("
                << worst_name << ")\n";
    };
    check_gradients(gpu_grads, "");

    // Deterministic in 16 bits too: the same step gives the same bits.
    gpu_model.forward(inputs.data(), targets.data(), nullptr);
    EXPECT_EQ(gpu_model.mean_loss(), gpu_loss) << "repeated forward" << label;
    gpu_->fill_zero(d_grads, param_elems);
    gpu_model.backward(gpu_sink, loss_scale);
    EXPECT_TRUE(all_close("repeated backward" + label, download(d_grads, param_elems), gpu_grads,
                          kBitExact));

    // A training step's form: forward takes the loss scale and computes the logits'
    // gradient with the loss in one kernel. The same bounds against the CPU, and the same
    // bits when repeated.
    const std::string early = " (dlogits in forward)";
    gpu_model.forward(inputs.data(), targets.data(), nullptr, loss_scale);
    const double early_loss = gpu_model.mean_loss();
    EXPECT_LE(std::fabs(early_loss - cpu_loss) / std::fabs(cpu_loss), tol_.model_loss_relative)
        << "loss" << early << label << ": gpu " << early_loss << ", cpu " << cpu_loss;
    gpu_->fill_zero(d_grads, param_elems);
    gpu_model.backward(gpu_sink, loss_scale);
    const auto early_grads = download(d_grads, param_elems);
    check_gradients(early_grads, early);
    gpu_model.forward(inputs.data(), targets.data(), nullptr, loss_scale);
    EXPECT_EQ(gpu_model.mean_loss(), early_loss) << "repeated forward" << early << label;
    gpu_->fill_zero(d_grads, param_elems);
    gpu_model.backward(gpu_sink, loss_scale);
    EXPECT_TRUE(all_close("repeated backward" + early + label, download(d_grads, param_elems), early_grads,
                          kBitExact));
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
  gpu_->matmul_backward({.dinp = dinp, .dweight = dweight, .dbias = nullptr, .dout = dout,
                         .inp = activation(inp), .weight = d_params, .rows = N, .in_channels = IC,
                         .out_channels = OC, .dinp_write = GradientWrite::accumulate});
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

}  // namespace
}  // namespace scalestudy::gpu_test
