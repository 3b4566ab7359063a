// A whole model step of the CUDA backend (two layers, causal and bidirectional) against
// the CPU reference: the loss and every gradient, in fp32, bf16 and fp16, through the
// cuBLAS attention and the fused one.
#include "cuda_ops_half_fixture.h"

namespace scalestudy::gpu_test {
namespace {

TEST_F(CudaOpsTest, WholeModelLossAndGradientsMatchTheCpu) {
  for (bool causal : {true, false}) {
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    const ModelShape shape{2, 64, 4, 101, 32, causal};
    const int batch = 3, seq = 17;
    const ParameterLayout layout = make_parameter_layout(shape);
    const size_t param_elems = layout.param_elems;
    Gpt cpu_model(cpu_, shape, batch, seq, param_elems);
    Gpt gpu_model(*gpu_, shape, batch, seq, param_elems);
    cpu_model.initialize(1234);
    gpu_model.initialize(1234);
    const auto inputs = random_ids(size_t(batch) * seq, 100, shape.vocab);
    const auto targets = random_ids(size_t(batch) * seq, 101, shape.vocab);

    cpu_model.forward(inputs.data(), targets.data(), nullptr);
    gpu_model.forward(inputs.data(), targets.data(), nullptr);
    const double cpu_loss = cpu_model.mean_loss(), gpu_loss = gpu_model.mean_loss();
    EXPECT_TRUE(all_close("mean loss" + label, std::vector<double>{gpu_loss},
                          std::vector<double>{cpu_loss}, kModelLoss));

    const float loss_scale = 1.0f / static_cast<float>(batch * seq);
    std::vector<float> cpu_grads(param_elems, 0.0f);
    FullGradient cpu_sink(cpu_grads.data());
    cpu_model.backward(cpu_sink, loss_scale);
    float* d_grads = upload(std::vector<float>(param_elems, 0.0f));
    FullGradient gpu_sink(d_grads);
    gpu_model.backward(gpu_sink, loss_scale);
    const auto gpu_grads = download(d_grads, param_elems);

    for (const TensorSpec& tensor : layout.tensors) {
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

    // The same step again on the GPU gives the same bits: no atomics, fixed reductions.
    gpu_model.forward(inputs.data(), targets.data(), nullptr);
    EXPECT_EQ(gpu_model.mean_loss(), gpu_loss) << "repeated forward" << label;
    gpu_->fill_zero(d_grads, param_elems);
    gpu_model.backward(gpu_sink, loss_scale);
    EXPECT_TRUE(all_close("repeated backward" + label, download(d_grads, param_elems), gpu_grads,
                          kBitExact));
  }
}

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

SCALESTUDY_HALF_PRECISION_TESTS();

}  // namespace
}  // namespace scalestudy::gpu_test
