// The classifier's ops of the CUDA backend against the CPU reference, in fp32, bf16 and
// fp16: the softmax cross-entropy (at the op shapes and at GPT-2's vocabulary) and, in 16
// bits, the tied LM head on padded logits rows.
#include "cuda_ops_fixture.h"

namespace scalestudy::gpu_test {
namespace {

TEST_P(CudaOpsShapes, SoftmaxCrossEntropy) { check_cross_entropy(shape().rows(), shape().vocab, ""); }

// GPT-2's vocabulary on enough rows that each row gets one warp, whose row spans many
// chunks of loads (the running max moves between them), at every alignment of a row.
TEST_P(CudaOpsPrecision, SoftmaxCrossEntropyAtGpt2Vocabulary) {
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
  gpu_->matmul_forward({.out = plain_logits, .inp = d_inp, .weight = d_weight, .rows = N,
                        .in_channels = C, .out_channels = V});
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
  const double unit = unit_roundoff(precision_);
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
  gpu_->matmul_forward({.out = replay_logits, .inp = d_inp, .weight = d_weight, .rows = N,
                        .in_channels = C, .out_channels = V});
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

// Logits of more than 2^31 elements, beyond cuBLAS's 32-bit indexing in one GEMM (the
// backend runs such GEMMs on row chunks): the classifier on 43000 rows of GPT-2's padded
// vocabulary, 2.16e9 logits, against the same ops on its two halves, each of which fits
// one GEMM. A chunk missed, cut short or taken twice leaves the NaN the outputs start as,
// or a row's loss, its dinp or the dweight off by whole rows. Otherwise they differ only
// as two GEMMs of other row counts may (cuBLAS may choose another algorithm): a logit
// rounded the other way moves a loss by at most 2u * max|logit|, and max|logit| <= C with
// inputs and weights in [-1, 1]; dinp and dweight are held to the GEMM tolerance.
TEST_F(CudaOpsBf16, ClassifierOnLogitsBeyond2To31Elements) {
  const int N = 43000, C = 64, V = 50257, half = N / 2;
  ASSERT_GT(double(N) * 50304, double(1LL << 31)) << "the logits must need more than one GEMM";
  const size_t weight_at = 8;
  const auto params = rounded(random_floats(weight_at + size_t(V) * C, 81));
  float* d_params = upload(params, MemoryKind::parameters);
  gpu_->parameters_changed(d_params, 0, params.size());
  const float* d_weight = d_params + weight_at;
  float* d_inp = activation(rounded(random_floats(size_t(N) * C, 82)));
  const int32_t* d_targets = upload(random_ids(N, 83, V));
  const float loss_scale = 1.0f / static_cast<float>(N);
  const std::vector<float> zeros(size_t(V) * C, 0.0f);

  // Each run: the training step's form over `rows` rows from `first`, into its own outputs.
  struct Outputs {
    float *losses, *stats, *dinp, *dweight;
  };
  const auto run = [&](float* logits, Outputs out, int first, int rows) {
    float* inp = gpu_->activation_at(d_inp, size_t(first) * C);
    gpu_->classifier_forward({.losses = out.losses + first, .row_stats = out.stats + 2 * size_t(first),
                              .logits = logits, .inp = inp, .weight = d_weight,
                              .targets = d_targets + first, .rows = rows, .channels = C, .vocab = V,
                              .dlogits_scale = loss_scale});
    gpu_->classifier_backward_from_dlogits({.dinp = gpu_->activation_at(out.dinp, size_t(first) * C),
                                            .dlogits = logits, .weight = d_weight, .rows = rows,
                                            .channels = C, .vocab = V,
                                            .dinp_write = GradientWrite::overwrite});
    gpu_->classifier_weight_backward({.dweight = out.dweight, .dlogits = logits, .inp = inp,
                                      .rows = rows, .channels = C, .vocab = V, .vocab_begin = 0,
                                      .vocab_end = V});
  };
  const auto outputs = [&] {
    return Outputs{poisoned_statistics(N), poisoned_statistics(2 * size_t(N)),
                   poisoned_activation(size_t(N) * C), upload(zeros)};
  };
  const Outputs whole = outputs(), halves = outputs();
  float* logits = gpu_->allocate_logits(N, V);
  owned_.push_back(logits);
  run(logits, whole, 0, N);
  gpu_->release(logits);  // 4.3 GB: the halves run in a buffer of their own
  owned_.pop_back();
  float* half_logits = gpu_->allocate_logits(half, V);
  owned_.push_back(half_logits);
  run(half_logits, halves, 0, half);
  run(half_logits, halves, half, N - half);

  expect_close("losses over 2^31 logits vs two halves", whole.losses, download(halves.losses, N),
               Tolerance{2 * unit_roundoff(precision_) * C, 0.0});
  expect_close("dinp over 2^31 logits vs two halves", whole.dinp, download(halves.dinp, size_t(N) * C),
               gemm_tolerance(download(halves.dinp, size_t(N) * C)));
  const std::vector<float> halves_dweight = download(halves.dweight, zeros.size());
  ASSERT_GT(max_abs(halves_dweight), 0.0) << "an all-zero gradient would test nothing";
  expect_close("dweight over 2^31 logits vs two halves", whole.dweight, halves_dweight,
               gemm_tolerance(halves_dweight));
}

SCALESTUDY_SHAPE_TESTS();
SCALESTUDY_HALF_SHAPE_TESTS();
SCALESTUDY_PRECISION_TESTS();

}  // namespace
}  // namespace scalestudy::gpu_test
