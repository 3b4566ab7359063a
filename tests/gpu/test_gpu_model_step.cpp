// A whole model step of the CUDA backend (two layers, causal and bidirectional) against
// the CPU reference: the loss and every gradient, in fp32, bf16 and fp16, through the
// cuBLAS attention and the fused one.
#include <optional>
#include <utility>

#include "backend/cuda/cudnn_attention.h"
#include "cuda_ops_fixture.h"

namespace scalestudy::gpu_test {
namespace {

// Both backends' models of one shape, initialised alike, with one batch of inputs and
// targets, and the GPU's gradient buffer.
struct ModelPair {
  ModelPair(CpuOps& cpu_ops, CudaOps& gpu_ops, const ModelShape& shape, int batch, int seq)
      : layout(make_parameter_layout(shape)),
        cpu(cpu_ops, shape, batch, seq, layout.param_elems),
        gpu(gpu_ops, shape, batch, seq, layout.param_elems),
        inputs(random_ids(size_t(batch) * seq, 100, shape.vocab)),
        targets(random_ids(size_t(batch) * seq, 101, shape.vocab)) {
    cpu.initialize(1234);
    gpu.initialize(1234);
    gpu_ops.parameters_changed(gpu.params(), 0, layout.param_elems);
  }
  ParameterLayout layout;
  Gpt cpu, gpu;
  std::vector<int32_t> inputs, targets;
};

class CudaOpsModel : public CudaOpsPrecision {
 protected:
  // The CPU's loss, after both forwards; the GPU's is model.gpu.mean_loss().
  static double forward_both(ModelPair& model) {
    model.cpu.forward(model.inputs.data(), model.targets.data(), nullptr);
    model.gpu.forward(model.inputs.data(), model.targets.data(), nullptr);
    return model.cpu.mean_loss();
  }
  // The gradients of both backends' backward, each into a zeroed buffer: the CPU's, and
  // the GPU's into d_grads (downloaded).
  std::pair<std::vector<float>, std::vector<float>> backward_both(ModelPair& model, float* d_grads,
                                                                  float loss_scale) {
    const size_t param_elems = model.layout.param_elems;
    std::vector<float> cpu_grads(param_elems, 0.0f);
    FullGradient cpu_sink(cpu_grads.data());
    model.cpu.backward(cpu_sink, loss_scale);
    gpu_->fill_zero(d_grads, param_elems);
    FullGradient gpu_sink(d_grads);
    model.gpu.backward(gpu_sink, loss_scale);
    return {std::move(cpu_grads), download(d_grads, param_elems)};
  }
  // The same GPU step again (the forward given dlogits_scale, as the step was) gives the
  // same loss and the same gradient bits: no atomics, fixed reductions.
  void expect_repeatable(ModelPair& model, float* d_grads, float loss_scale,
                         std::optional<float> dlogits_scale, double loss,
                         const std::vector<float>& grads, const std::string& label) {
    model.gpu.forward(model.inputs.data(), model.targets.data(), nullptr, dlogits_scale);
    EXPECT_EQ(model.gpu.mean_loss(), loss) << "repeated forward" << label;
    gpu_->fill_zero(d_grads, model.layout.param_elems);
    FullGradient gpu_sink(d_grads);
    model.gpu.backward(gpu_sink, loss_scale);
    EXPECT_TRUE(all_close("repeated backward" + label, download(d_grads, model.layout.param_elems),
                          grads, kBitExact));
  }
};
class CudaOpsFp32Model : public CudaOpsModel {};
struct WholeModelCase {
  int channels, heads, seq;
  const char* attention;
};

class CudaOpsHalfModel : public CudaOpsModel {
 protected:
  void check_whole_model(const WholeModelCase& model_case, bool causal);
};

TEST_P(CudaOpsFp32Model, WholeModelLossAndGradientsMatchTheCpu) {
  for (bool causal : {true, false}) {
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    const int batch = 3, seq = 17;
    ModelPair model(cpu_, *gpu_, ModelShape{2, 64, 4, 101, 32, causal}, batch, seq);
    const double cpu_loss = forward_both(model), gpu_loss = model.gpu.mean_loss();
    EXPECT_TRUE(all_close("mean loss" + label, std::vector<double>{gpu_loss},
                          std::vector<double>{cpu_loss}, kModelLoss));

    const float loss_scale = 1.0f / static_cast<float>(batch * seq);
    float* d_grads = upload(std::vector<float>(model.layout.param_elems, 0.0f));
    const auto [cpu_grads, gpu_grads] = backward_both(model, d_grads, loss_scale);
    for (const TensorSpec& tensor : model.layout.tensors) {
      const auto begin = static_cast<std::ptrdiff_t>(tensor.offset_elems);
      const auto end = begin + static_cast<std::ptrdiff_t>(tensor.elems);
      const std::vector<float> ref(cpu_grads.begin() + begin, cpu_grads.begin() + end);
      const std::vector<float> got(gpu_grads.begin() + begin, gpu_grads.begin() + end);
      double scale = 0.0;
      for (float value : ref) scale = std::max(scale, double{std::fabs(value)});
      EXPECT_GT(scale, 0.0) << tensor.name << label << ": an all-zero gradient tests nothing";
      EXPECT_TRUE(all_close("gradient of " + tensor.name + label, got, ref,
                            Tolerance{kModelGradient.atol * scale, kModelGradient.rtol}));
    }
    expect_repeatable(model, d_grads, loss_scale, std::nullopt, gpu_loss, gpu_grads, label);
  }
}

// The whole model of one case in 16 bits against the fp32 CPU, through gpu_.
void CudaOpsHalfModel::check_whole_model(const WholeModelCase& model_case, bool causal) {
  const std::string label = std::string(causal ? " (causal, " : " (bidirectional, ") + model_case.attention + ")";
  const int batch = 3, seq = model_case.seq;
  ModelPair model(cpu_, *gpu_, ModelShape{2, model_case.channels, model_case.heads, 101, 80, causal},
                  batch, seq);
  const double cpu_loss = forward_both(model), gpu_loss = model.gpu.mean_loss();
  const double loss_error = std::fabs(gpu_loss - cpu_loss) / std::fabs(cpu_loss);
  EXPECT_LE(loss_error, tol_.model_loss_relative) << "loss" << label << ": gpu " << gpu_loss
                                            << ", cpu " << cpu_loss;
  std::cout << "  loss" << label << ": cpu " << cpu_loss << ", " << name() << " gpu " << gpu_loss
            << ", relative error " << loss_error << "\n";

  const float loss_scale = tol_.model_loss_scale / static_cast<float>(batch * seq);
  float* d_grads = upload(std::vector<float>(model.layout.param_elems, 0.0f), MemoryKind::gradients);
  const auto [cpu_grads, gpu_grads] = backward_both(model, d_grads, loss_scale);

  // Every tensor's gradient within the norm-wise bound of the CPU's.
  auto check_gradients = [&](const std::vector<float>& grads, const std::string& form) {
    double worst = 0.0;
    std::string worst_name;
    for (const TensorSpec& tensor : model.layout.tensors) {
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
  // Deterministic in 16 bits too.
  expect_repeatable(model, d_grads, loss_scale, std::nullopt, gpu_loss, gpu_grads, label);

  // A training step's form: forward takes the loss scale and computes the logits'
  // gradient with the loss in one kernel. The same bounds against the CPU, and the same
  // bits when repeated.
  const std::string early = " (dlogits in forward)";
  model.gpu.forward(model.inputs.data(), model.targets.data(), nullptr, loss_scale);
  const double early_loss = model.gpu.mean_loss();
  EXPECT_LE(std::fabs(early_loss - cpu_loss) / std::fabs(cpu_loss), tol_.model_loss_relative)
      << "loss" << early << label << ": gpu " << early_loss << ", cpu " << cpu_loss;
  gpu_->fill_zero(d_grads, model.layout.param_elems);
  FullGradient gpu_sink(d_grads);
  model.gpu.backward(gpu_sink, loss_scale);
  const auto early_grads = download(d_grads, model.layout.param_elems);
  check_gradients(early_grads, early);
  expect_repeatable(model, d_grads, loss_scale, loss_scale, early_loss, early_grads, early + label);
}

// Head size 16 runs the cuBLAS attention; head size 64 the fused kernels
// (allocate_attention_state keeps the log-sum-exp), over more than one 64-row tile.
TEST_P(CudaOpsHalfModel, WholeModelLossAndGradientsMatchTheFp32Cpu) {
  for (const WholeModelCase& model_case : {WholeModelCase{64, 4, 17, "cuBLAS attention"},
                                           WholeModelCase{128, 2, 70, "fused attention"}})
    for (bool causal : {true, false}) check_whole_model(model_case, causal);
}

// bf16 with cuDNN's attention, as train runs it where libcudnn loads: the attention's output
// in augmented rows (attention_output_stride), which the projection reads at that stride.
TEST_P(CudaOpsHalfModel, WholeModelWithCudnnAttentionMatchesTheFp32Cpu) {
  if (precision_ != Precision::bf16) GTEST_SKIP() << "cuDNN's attention runs in bf16 only";
  std::string why_not;
  if (!cudnn_attention_loadable(why_not)) GTEST_SKIP() << "cuDNN's attention unavailable: " << why_not;
  gpu_ = std::make_unique<CudaOps>(0, precision_, GemmAlgos::heuristic, AttentionKernel::cudnn);
  const WholeModelCase model_case{128, 2, 70, "cuDNN attention"};
  ASSERT_NE(gpu_->attention_output_stride({3, model_case.seq, model_case.channels, model_case.heads, true}), 0)
      << "the model's attention output must be in augmented rows with cuDNN";
  for (bool causal : {true, false}) check_whole_model(model_case, causal);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaOpsFp32Model, ::testing::Values(Precision::fp32),
                         precision_test_name);
INSTANTIATE_TEST_SUITE_P(Precisions, CudaOpsHalfModel, ::testing::ValuesIn(kHalfPrecisions),
                         precision_test_name);

}  // namespace
}  // namespace scalestudy::gpu_test
