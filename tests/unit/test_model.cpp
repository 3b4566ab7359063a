// The whole model on the CPU oracle: its gradient against central finite differences of its
// loss; the loss scale in forward, the embeddings' gradient reported in parts and
// recomputation, each giving the plain step's gradient bit for bit; the end-to-end learning
// check on the Markov source; dynamic loss scaling (the scaler's rule, an exact no-op when
// nothing overflows, and a skipped step when the gradients are not finite); and the
// inference forward against the training forward, with its memory against its prediction.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "config/run_config.h"
#include "model/gpt.h"
#include "model/gpt_inference.h"
#include "optim/loss_scaler.h"
#include "parallel/ddp_strategy.h"
#include "train/trainer.h"
#include "training.h"

namespace scalestudy {
namespace {

// Hands backward one full gradient buffer, as ddp does.
class FullGradient : public GradientSink {
 public:
  explicit FullGradient(size_t elems) : grads(elems, 0.0f) {}
  float* tensor_gradients(size_t tensor_begin_elems) override { return grads.data() + tensor_begin_elems; }
  void segment_done(int segment) override { done.push_back(segment); }
  std::vector<float> grads;
  std::vector<int> done;
};

// Random inputs and targets of one micro-batch.
struct TokenBatch {
  TokenBatch(int vocab, int count, unsigned seed) : inputs(count), targets(count) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> token(0, vocab - 1);
    for (auto& t : inputs) t = token(rng);
    for (auto& t : targets) t = token(rng);
  }
  std::vector<int32_t> inputs, targets;
};

// Expects `actual` equal to `expected` bit for bit, counting the elements that differ;
// `what` says what changed between the two runs.
void expect_same_gradients(const std::vector<float>& actual, const std::vector<float>& expected,
                           const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  size_t differing = 0;
  for (size_t i = 0; i < expected.size(); ++i) differing += actual[i] != expected[i];
  EXPECT_EQ(differing, 0u) << "gradient elements that differ " << what;
}

struct GradientCase {
  bool causal;
};

class WholeModelGradient : public ::testing::TestWithParam<GradientCase> {};

TEST_P(WholeModelGradient, MatchesCentralFiniteDifferences) {
  // Tolerance: |analytic - numeric| <= kAtol + kRtol*|numeric|. The loss is computed in
  // fp32 (relative rounding ~1e-7 on a loss of ~2.4), so a step of kStep gives a numeric
  // derivative good to ~2.4e-7/kStep ≈ 1e-5, and the truncation error is O(kStep²).
  // Parameters are drawn with std 0.3 (not GPT-2's 0.02) so gradients are O(0.01–1),
  // well above that noise.
  constexpr double kStep = 1e-2;
  constexpr double kAtol = 2e-4;
  constexpr double kRtol = 2e-2;

  CpuOps ops;
  const ModelShape shape{2, 8, 2, 11, 6, GetParam().causal};
  const int batch = 2, seq = 5;
  const ParameterLayout layout = make_parameter_layout(shape);
  Gpt model(ops, shape, batch, seq, layout.param_elems);

  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> params(layout.param_elems);
  for (float& p : params) p = normal(rng);
  for (const auto& tensor : layout.tensors)  // LayerNorm weights near 1, as in a real model
    if (tensor.name.find("ln") != std::string::npos && tensor.name.find("weight") != std::string::npos)
      for (size_t i = 0; i < tensor.elems; ++i) params[tensor.offset_elems + i] += 1.0f;
  std::uniform_int_distribution<int> token(0, shape.vocab - 1);
  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  for (auto& t : inputs) t = token(rng);
  for (auto& t : targets) t = token(rng);

  auto loss_at = [&](const std::vector<float>& p) {
    ops.copy_from_host(model.params(), p.data(), p.size());
    model.forward(inputs.data(), targets.data(), nullptr);
    return model.mean_loss();
  };

  loss_at(params);
  FullGradient sink(layout.param_elems);
  model.backward(sink, 1.0f / static_cast<float>(batch * seq));
  // Segments finish from the end of the buffer down, the embeddings last.
  ASSERT_EQ(sink.done.size(), layout.segments.size());
  EXPECT_EQ(sink.done.front(), layout.final_norm_segment());
  EXPECT_EQ(sink.done.back(), layout.embedding_segment());

  // Every tensor, several elements each (all of a small tensor).
  int checked = 0, mismatches = 0;
  for (const auto& tensor : layout.tensors) {
    const size_t stride = tensor.elems > 12 ? tensor.elems / 12 : 1;
    for (size_t i = 0; i < tensor.elems; i += stride) {
      const size_t at = tensor.offset_elems + i;
      std::vector<float> plus = params, minus = params;
      plus[at] += static_cast<float>(kStep);
      minus[at] -= static_cast<float>(kStep);
      // The perturbation actually applied, after rounding to fp32.
      const double step = (static_cast<double>(plus[at]) - static_cast<double>(minus[at])) / 2.0;
      const double numeric = (loss_at(plus) - loss_at(minus)) / (2.0 * step);
      const double analytic = sink.grads[at];
      ++checked;
      if (std::fabs(analytic - numeric) > kAtol + kRtol * std::fabs(numeric)) {
        if (mismatches++ == 0)
          ADD_FAILURE() << "first mismatch: " << tensor.name << "[" << i << "] analytic " << analytic
                        << " numeric " << numeric;
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked << " checked";
  EXPECT_GT(checked, 150);
}

INSTANTIATE_TEST_SUITE_P(Attention, WholeModelGradient,
                         ::testing::Values(GradientCase{true}, GradientCase{false}),
                         [](const auto& info) { return info.param.causal ? "causal" : "bidirectional"; });

// A training step hands forward its loss scale, so that the classifier leaves the
// logits' gradient behind with the loss (Ops::classifier_forward). On the CPU that is
// the cross-entropy's backward run earlier, on the same values: the loss and every
// gradient must be bit-identical to forward-then-backward, over two micro-batches.
TEST(TrainingForward, LossScaleInForwardGivesTheSameLossAndGradientsBitForBit) {
  const ModelShape shape{2, 16, 2, 23, 12, true};
  const int batch = 3, seq = 9;
  const ParameterLayout layout = make_parameter_layout(shape);
  const TokenBatch tokens(shape.vocab, batch * seq, 8);
  const float loss_scale = 0.5f;

  auto run = [&](bool scale_in_forward) {
    CpuOps ops;
    Gpt model(ops, shape, batch, seq, layout.param_elems);
    model.initialize(99);
    FullGradient sink(layout.param_elems);
    std::vector<double> losses;
    for (int micro = 0; micro < 2; ++micro) {
      if (scale_in_forward)
        model.forward(tokens.inputs.data(), tokens.targets.data(), nullptr, loss_scale);
      else
        model.forward(tokens.inputs.data(), tokens.targets.data(), nullptr);
      losses.push_back(model.mean_loss());
      model.backward(sink, loss_scale);
    }
    return std::make_pair(losses, sink.grads);
  };
  const auto plain = run(false), early = run(true);
  EXPECT_EQ(early.first, plain.first);
  expect_same_gradients(early.second, plain.second, "with the loss scale in forward");
  double gradient_norm = 0.0;
  for (float g : plain.second) gradient_norm += double{g} * g;
  EXPECT_GT(gradient_norm, 0.0) << "all-zero gradients would test nothing";
}

// A sink that asks for the embeddings in parts. At each part's report it checks that the
// gradients from the part's start to the segment's end already hold their final values.
class PartsSink : public FullGradient {
 public:
  PartsSink(const ParameterLayout& layout, std::vector<size_t> cuts, const std::vector<float>& final_grads)
      : FullGradient(final_grads.size()), layout_(layout), cuts_(std::move(cuts)), final_(final_grads) {}
  std::vector<size_t> segment_cuts(int segment) const override {
    return segment == layout_.embedding_segment() ? cuts_ : std::vector<size_t>{};
  }
  void segment_done_from(int segment, size_t offset_elems) override {
    parts.push_back(offset_elems);
    const Segment& seg = layout_.segments[segment];
    for (size_t i = seg.begin_elems + offset_elems; i < seg.end_elems; ++i)
      if (grads[i] != final_[i]) ++early_reports;
  }
  std::vector<size_t> parts;
  size_t early_reports = 0;  // elements reported final before they were

 private:
  const ParameterLayout& layout_;
  std::vector<size_t> cuts_;
  const std::vector<float>& final_;
};

// The LM head's weight gradient, last in backward, comes in parts from the last vocabulary
// rows down, each starting on a whole row, a multiple of 8, at or below a cut; a cut in wpe
// is final at once, and a cut below row 8 makes no part. The gradient is the uncut one,
// bit for bit.
TEST(EmbeddingsInParts, ReportedFromTheEndDownOnWholeRowsWithTheUncutGradient) {
  const ModelShape shape{2, 8, 2, 43, 6, true};
  const int batch = 2, seq = 6;
  const ParameterLayout layout = make_parameter_layout(shape);
  ASSERT_EQ(layout.wte, layout.segments[layout.embedding_segment()].begin_elems);
  const TokenBatch tokens(shape.vocab, batch * seq, 17);
  const size_t wpe_at = static_cast<size_t>(shape.vocab) * shape.channels;  // 344
  auto run = [&](GradientSink& sink) {
    CpuOps ops;
    Gpt model(ops, shape, batch, seq, layout.param_elems);
    model.initialize(5);
    model.forward(tokens.inputs.data(), tokens.targets.data(), nullptr, 0.25f);
    model.backward(sink, 0.25f);
  };
  FullGradient uncut(layout.param_elems);
  run(uncut);
  // Rows 0, 12 and 25 of C = 8, and 5 elements into wpe.
  PartsSink parts(layout, {3, 100, 200, wpe_at + 5}, uncut.grads);
  run(parts);
  // Row 25 gives the part from row 24, row 12 the one from row 8.
  EXPECT_EQ(parts.parts, (std::vector<size_t>{wpe_at + 5, 24 * 8, 8 * 8}));
  EXPECT_EQ(parts.early_reports, 0u);
  EXPECT_EQ(parts.done.back(), layout.embedding_segment());
  EXPECT_EQ(parts.grads, uncut.grads);
}

// Recomputation runs the same ops on the same inputs in the same order, so the loss and
// every gradient must be bit-identical to the run that kept its activations, and the
// backward must hand the sink the same segments in the same order.
TEST(Recomputation, SameLossAndGradientsBitForBitWithLessActivationMemory) {
  const ModelShape shape{4, 16, 2, 23, 12, true};
  const int batch = 3, seq = 9;
  const ParameterLayout layout = make_parameter_layout(shape);
  const TokenBatch tokens(shape.vocab, batch * seq, 7);

  struct Result {
    double loss;
    std::vector<float> grads;
    std::vector<int> order;
    size_t activation_bytes;
  };
  auto run = [&](bool recompute) {
    CpuOps ops;
    Gpt model(ops, shape, batch, seq, layout.param_elems, recompute);
    model.initialize(99);
    FullGradient sink(layout.param_elems);
    Result result{};
    // Two micro-batches: the second backward accumulates over the first, as with
    // gradient accumulation.
    for (int micro = 0; micro < 2; ++micro) {
      model.forward(tokens.inputs.data(), tokens.targets.data(), nullptr);
      result.loss = model.mean_loss();
      model.backward(sink, 0.5f);
    }
    result.grads = sink.grads;
    result.order = sink.done;
    result.activation_bytes = ops.allocated_bytes(MemoryKind::activations);
    return result;
  };
  const Result kept = run(false), recomputed = run(true);
  EXPECT_EQ(recomputed.loss, kept.loss);
  expect_same_gradients(recomputed.grads, kept.grads, "with recomputation");
  EXPECT_EQ(recomputed.order, kept.order);

  // Per block, without recomputation: ln1, atty, residual2, ln2, residual3 (N·C each),
  // qkv (3·N·C), fch and fch_gelu (4·N·C each), the probabilities (B·NH·T²) and four
  // row statistics (N each). With it, blocks 1..L-1 keep only residual3.
  const size_t N = static_cast<size_t>(batch) * seq, C = shape.channels;
  const size_t block_floats = 16 * N * C + static_cast<size_t>(batch) * shape.heads * seq * seq + 4 * N;
  const size_t saved_floats = (shape.layers - 1) * (block_floats - N * C);
  EXPECT_EQ(kept.activation_bytes - recomputed.activation_bytes, saved_floats * sizeof(float));
}

TEST(Learning, TinyModelLearnsTheMarkovSourceDownToItsEntropyRate) {
  // The loss must start near ln V (the model knows nothing) and end within 10% of the
  // source's exact entropy rate H, the lowest loss any model can reach on it.
  RunConfig config;
  const char* argv[] = {"train", "--model", "tiny", "--data", "markov", "--steps", "300", "--batch-per-rank", "8",
                        "--lr", "1e-2", "--lr-warmup-steps", "10", "--weight-decay", "0", "--warmup-steps", "1"};
  ASSERT_TRUE(parse_train_config(static_cast<int>(std::size(argv)), argv, config));
  CpuOps ops;
  MpiCommunicator comm(MPI_COMM_SELF, 60.0);
  Trainer trainer(config, ops, comm, MPI_COMM_SELF);

  struct Losses : StepObserver {
    void on_step(const StepRecord& r) override { values.push_back(r.loss); }
    std::vector<double> values;
  } losses;
  trainer.run(&losses);

  const double entropy_rate = *trainer.data().entropy_rate_nats();
  const double uniform = std::log(static_cast<double>(config.shape.vocab));
  ASSERT_LT(entropy_rate, 0.6 * uniform) << "the source must be far from uniform for this test to mean anything";
  EXPECT_NEAR(losses.values.front(), uniform, 0.05 * uniform);
  // One step's loss is noisy (8 samples); the mean of the last 20 steps is not.
  const double final_loss =
      std::accumulate(losses.values.end() - 20, losses.values.end(), 0.0) / 20.0;
  EXPECT_LT(final_loss, 1.10 * entropy_rate) << "H = " << entropy_rate;
  EXPECT_GT(final_loss, 0.95 * entropy_rate) << "below the entropy rate: the data must be leaking";
}

// A tiny run of 4 steps without warm-up, with `extra` options, for the loss-scaling tests.
RunConfig tiny_run_config(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model", "tiny", "--seq", "16", "--batch-per-rank", "4",
                                   "--steps", "4", "--warmup-steps", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_train_options(args);
}

TEST(LossScaler, HalvesOnOverflowAndDoublesAfterAGoodRun) {
  DynamicLossScaler scaler(true, 1024.0f, 3);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  DynamicLossScaler off(false, 1024.0f, 3);
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_TRUE(off.update(false));
}

TEST(LossScaler, DefaultsFollowThePrecision) {
  EXPECT_FALSE(tiny_run_config({}).loss_scaling);
  EXPECT_TRUE(tiny_run_config({"--loss-scaling", "on"}).loss_scaling);
}

TEST(LossScaling, APowerOfTwoScaleChangesNothingWithoutOverflow) {
  // Scaling by 2^10 and unscaling by 2^-10 are exact in fp32 away from overflow and
  // underflow, so the parameters must match bit for bit.
  const std::vector<float> plain = train_on_cpu(tiny_run_config({}), MPI_COMM_SELF);
  const std::vector<float> scaled =
      train_on_cpu(tiny_run_config({"--loss-scaling", "on", "--loss-scale-init", "1024"}), MPI_COMM_SELF);
  ASSERT_EQ(plain.size(), scaled.size());
  EXPECT_EQ(count_differing(plain, scaled), 0u);
}

TEST(LossScaling, NonFiniteGradientsSkipTheUpdate) {
  const RunConfig config = tiny_run_config({"--loss-scaling", "on"});
  CpuOps ops;
  MpiCommunicator comm(MPI_COMM_SELF, 60.0);
  const ParameterLayout layout = make_parameter_layout(config.shape);
  const BucketPlan plan = make_bucket_plan(layout.param_elems, 1e9, 1);
  Gpt model(ops, config.shape, 4, 16, plan.padded_elems);
  model.initialize(1);
  DdpStrategy strategy(config.data_parallel(), ops, comm, model, plan);
  std::vector<int32_t> tokens(4 * 16, 3), targets(4 * 16, 5);
  model.forward(tokens.data(), targets.data(), &strategy);
  strategy.begin_micro_batch(0, 1);
  model.backward(strategy, 1.0f / 64);
  strategy.finish_gradient_sync();
  strategy.tensor_gradients(layout.segments[1].begin_elems)[7] = std::numeric_limits<float>::infinity();

  std::vector<float> before(layout.param_elems), after(layout.param_elems);
  ops.copy_to_host(before.data(), model.params(), before.size());
  const OptimizerStats stats = strategy.optimizer_step(1e-3f, 1, 1.0f / 65536);
  ops.copy_to_host(after.data(), model.params(), after.size());
  EXPECT_TRUE(stats.skipped);
  EXPECT_EQ(before, after);
}

std::vector<int32_t> random_token_ids(int vocab, size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::vector<int32_t> ids(count);
  for (auto& id : ids) id = token(rng);
  return ids;
}

size_t allocated_total(const CpuOps& ops) {
  size_t total = 0;
  for (int kind = 0; kind < kMemoryKindCount; ++kind) total += ops.allocated_bytes(static_cast<MemoryKind>(kind));
  return total;
}

// vocab 37 gives logits smaller than the working set, which then sizes the logits'
// allocation; vocab 400 gives logits larger than it, as BERT's and GPT-2's are.
struct InferenceCase {
  int layers;
  bool causal;
  int vocab = 37;
};

class InferenceForward : public ::testing::TestWithParam<InferenceCase> {};

// The same ops in the same order on the same values: the CPU gives the same bits. The
// one op that differs, the MLP's GELU, runs in place on the dense layer's output instead
// of from a kept copy of it, which changes no value.
TEST_P(InferenceForward, LogitsEqualTheTrainingForwardsBitForBit) {
  CpuOps ops;
  const ModelShape shape{GetParam().layers, 16, 4, GetParam().vocab, 9, GetParam().causal};
  const int batch = 3, seq = 7;
  const size_t rows = static_cast<size_t>(batch) * seq;
  const std::vector<int32_t> tokens = random_token_ids(shape.vocab, rows, 5);
  const std::vector<int32_t> targets = random_token_ids(shape.vocab, rows, 6);

  Gpt training(ops, shape, batch, seq, make_parameter_layout(shape).param_elems);
  training.initialize(42);
  training.forward(tokens.data(), targets.data(), nullptr);
  std::vector<float> expected(rows * shape.vocab);
  ops.copy_to_host(expected.data(), training.logits(), expected.size());

  GptInference inference(ops, shape, batch, seq);
  inference.initialize(42);
  inference.forward(tokens.data());
  std::vector<float> logits(rows * shape.vocab);
  ops.copy_to_host(logits.data(), inference.logits(), logits.size());

  ASSERT_EQ(logits.size(), expected.size());
  for (size_t i = 0; i < logits.size(); ++i) ASSERT_EQ(logits[i], expected[i]) << "logit " << i;
}

TEST_P(InferenceForward, AllocatesExactlyWhatItPredicts) {
  CpuOps ops;
  const ModelShape shape{GetParam().layers, 16, 4, GetParam().vocab, 9, GetParam().causal};
  const size_t before = allocated_total(ops);
  GptInference inference(ops, shape, 2, 9);
  EXPECT_EQ(allocated_total(ops) - before, inference_memory(shape, 2, 9).bytes(ops));
}

INSTANTIATE_TEST_SUITE_P(Shapes, InferenceForward,
                         ::testing::Values(InferenceCase{0, true}, InferenceCase{1, true}, InferenceCase{3, true},
                                           InferenceCase{3, false}, InferenceCase{3, false, 400},
                                           InferenceCase{2, true, 400}));

// The working set does not grow with depth: a 12-layer model needs only its larger
// parameters beyond a 1-layer one's.
TEST(InferenceMemory, WorkingSetIsOneLayers) {
  const ModelShape one{1, 64, 4, 100, 32, true};
  ModelShape twelve = one;
  twelve.layers = 12;
  const InferenceMemory a = inference_memory(one, 4, 32), b = inference_memory(twelve, 4, 32);
  EXPECT_EQ(a.working_elems, b.working_elems);
  EXPECT_EQ(a.layernorm_elems, b.layernorm_elems);
  EXPECT_EQ(a.statistics_elems, b.statistics_elems);
  EXPECT_GT(b.parameter_elems, a.parameter_elems);
}

// With logits larger than the working set, the working set costs nothing beyond them:
// the prediction is the logits of the batch plus the buffers that stay beside them.
TEST(InferenceMemory, WorkingSetLiesInsideLargerLogits) {
  CpuOps ops;
  const ModelShape shape{2, 16, 4, 400, 32, false};
  const InferenceMemory m = inference_memory(shape, 4, 32);
  ASSERT_GT(ops.logits_bytes(m.logits_rows, m.vocab), ops.floats_bytes(m.working_elems, MemoryKind::activations));
  EXPECT_EQ(m.logits_allocation_rows(ops), static_cast<size_t>(m.logits_rows));
  const size_t beside_bytes = ops.floats_bytes(m.parameter_elems, MemoryKind::parameters) +
                              ops.floats_bytes(m.layernorm_elems, MemoryKind::activations) +
                              DeviceMemory::statistics_bytes(m.statistics_elems) +
                              DeviceMemory::ints_bytes(m.token_elems) + ops.attention_state_bytes(m.attention);
  EXPECT_EQ(m.bytes(ops), beside_bytes + ops.logits_bytes(m.logits_rows, m.vocab));
}

}  // namespace
}  // namespace scalestudy
