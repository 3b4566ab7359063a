// The inference forward against the training forward on the CPU oracle, and its memory
// against its prediction.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "model/gpt.h"
#include "model/gpt_inference.h"

namespace scalestudy {
namespace {

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
