// The inference forward of the CUDA backend against its training forward, in fp32, bf16
// and fp16, through the fused attention and the GEMM epilogues, and its memory against
// its prediction.
#include "cuda_test_support.h"
#include "model/gpt_inference.h"

namespace scalestudy::gpu_test {
namespace {

// Two layers, head size 64 (the fused attention's in 16-bit), a vocabulary that is not a
// multiple of 8 (padded 16-bit logits rows) and 70 tokens (more than one 64-row tile).
ModelShape test_shape(bool causal) { return ModelShape{2, 128, 2, 517, 80, causal}; }
constexpr int kBatch = 3, kSeq = 70;

size_t allocated_total(const CudaOps& ops) {
  size_t total = 0;
  for (int kind = 0; kind < kMemoryKindCount; ++kind) total += ops.allocated_bytes(static_cast<MemoryKind>(kind));
  return total;
}

class InferenceOnGpu : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
    gpu_ = std::make_unique<CudaOps>(0, GetParam());
  }
  // The logits as fp32, [rows, vocab]: the 16-bit rows' padding columns are left out,
  // since no op reads them and the inference forward's working set shares their memory.
  std::vector<float> download_logits(const float* logits, const ModelShape& shape) {
    const size_t elem_bytes = GetParam() == Precision::fp32 ? sizeof(float) : size_t{2};
    const size_t rows = size_t(kBatch) * kSeq, vocab = size_t(shape.vocab);
    const size_t stride = gpu_->logits_bytes(1, shape.vocab) / elem_bytes;
    std::vector<float> padded(rows * stride);
    gpu_->copy_to_host(padded.data(), logits, padded.size());
    std::vector<float> host(rows * vocab);
    for (size_t row = 0; row < rows; ++row)
      std::copy_n(padded.begin() + static_cast<std::ptrdiff_t>(row * stride), vocab,
                  host.begin() + static_cast<std::ptrdiff_t>(row * vocab));
    return host;
  }
  std::unique_ptr<CudaOps> gpu_;
};

// fp32 and fp16 run the same kernels in both forwards (the GELU epilogues are bf16's
// only), so the bits agree. In bf16 the MLP's first GEMM takes cuBLASLt's GELU epilogue
// without the auxiliary output, whose algorithm cuBLASLt may choose differently: each
// hidden value may then round the other way, one bf16 step (2^-8 relative). The
// tolerance allows two such steps (2^-7) of the largest logit and of each logit; the
// LayerNorms that follow keep the difference from growing.
TEST_P(InferenceOnGpu, LogitsMatchTheTrainingForward) {
  const Tolerance tolerance = GetParam() == Precision::bf16 ? Tolerance{0x1p-7, 0x1p-7} : Tolerance{0.0, 0.0};
  for (bool causal : {true, false}) {
    const ModelShape shape = test_shape(causal);
    const auto tokens = random_ids(size_t(kBatch) * kSeq, 7, shape.vocab);
    const auto targets = random_ids(size_t(kBatch) * kSeq, 8, shape.vocab);
    Gpt training(*gpu_, shape, kBatch, kSeq, make_parameter_layout(shape).param_elems);
    training.initialize(99);
    gpu_->parameters_changed(training.params(), 0, training.padded_param_elems());
    training.forward(tokens.data(), targets.data(), nullptr);
    const std::vector<float> expected = download_logits(training.logits(), shape);

    GptInference inference(*gpu_, shape, kBatch, kSeq);
    inference.initialize(99);
    inference.forward(tokens.data());
    const std::vector<float> logits = download_logits(inference.logits(), shape);

    double scale = 0.0;
    for (float value : expected) scale = std::max(scale, double{std::fabs(value)});
    ASSERT_GT(scale, 0.0) << "all-zero logits test nothing";
    EXPECT_TRUE(all_close(std::string("inference logits") + (causal ? " (causal)" : " (bidirectional)"), logits,
                          expected, Tolerance{tolerance.atol * scale, tolerance.rtol}));
  }
}

TEST_P(InferenceOnGpu, AllocatesExactlyWhatItPredicts) {
  for (bool causal : {true, false}) {
    const ModelShape shape = test_shape(causal);
    const size_t before = allocated_total(*gpu_);
    GptInference inference(*gpu_, shape, kBatch, kSeq);
    EXPECT_EQ(allocated_total(*gpu_) - before, inference_memory(shape, kBatch, kSeq).bytes(*gpu_));
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, InferenceOnGpu,
                         ::testing::Values(Precision::fp32, Precision::bf16, Precision::fp16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

}  // namespace
}  // namespace scalestudy::gpu_test
