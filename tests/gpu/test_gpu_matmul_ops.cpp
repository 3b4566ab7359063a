// The dense layer of the CUDA backend against the CPU reference, in fp32, bf16 and fp16:
// the GEMMs with their bias, the dense-GELU pair, and cuBLASLt's bias and GELU epilogues at
// GPT-2's shapes (which shapes take them, the tanh GELU they compute, and the timed
// algorithm choice made once per process), and every 16-bit GEMM with the algorithms a
// chooser or a choice file names.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

#include "cuda_ops_fixture.h"

namespace scalestudy::gpu_test {
namespace {

TEST_P(CudaOpsShapes, Matmul) {
  const OpShape s = shape();
  for (const DenseCase& c : dense_cases(s)) check_matmul(c, s.rows());
}

// The bias gradient's column sums over many rows, in chunks of 64 rows: at 32800 the last
// is partly empty. 768 columns take the 16-byte kernel, 770 the element one; both are held
// to double sums.
TEST_P(CudaOpsHalf, BiasGradientOverManyRows) {
  constexpr int N = 32800, kIn = 8;
  for (int out_channels : {768, 770}) {
    const std::string label = " (" + std::to_string(out_channels) + " columns)";
    const auto params = rounded(random_floats(size_t(out_channels) * (kIn + 1), 31));
    float* d_params = upload(params, MemoryKind::parameters);
    gpu_->parameters_changed(d_params, 0, params.size());
    const auto inp = rounded(random_floats(size_t(N) * kIn, 30));
    const auto dout = rounded(random_floats(size_t(N) * out_channels, 33));
    float* d_dbias = upload(std::vector<float>(out_channels, 0.0f));
    gpu_->matmul_backward({.dinp = poisoned_activation(inp.size()),
                           .dweight = upload(std::vector<float>(size_t(out_channels) * kIn, 0.0f)),
                           .dbias = d_dbias, .dout = activation(dout), .inp = activation(inp),
                           .weight = d_params, .rows = N, .in_channels = kIn,
                           .out_channels = out_channels, .dinp_write = GradientWrite::overwrite});
    expect_close("matmul dbias" + label, d_dbias, double_column_sums(dout, N, out_channels),
                 kManyRowColumnSum);
  }
}

// In 16 bits the model's LayerNorm outputs are augmented rows (kernels/op_params.h): the
// LayerNorm writes the ones column after each row, the dense layer after it reads its rows
// at the stride, and its backward takes the bias gradient from the weight gradient's GEMM.
// Every result against the CPU's over the same rows, the bias gradient against double
// sums. 256 rows keep the weight gradient within kDotProduct's dot products of up to 1000
// terms: over 1024 rows of fp16 LayerNorm outputs (up to ~4), the CPU's and the GPU's fp32
// sums were up to 2.8e-4 apart.
TEST_P(CudaOpsHalf, AugmentedRowsGiveTheCpuResults) {
  constexpr int N = 256, C = 64;
  const int stride = gpu_->dense_input_stride(C);
  ASSERT_GE(stride, C + kAugmentedColumns);
  const auto x = rounded(random_floats(size_t(N) * C, 40, -3.0f, 5.0f));
  const auto ln_weight = rounded(random_floats(C, 41, 0.5f, 1.5f));
  const auto ln_bias = rounded(random_floats(C, 42));
  std::vector<float> ln(size_t(N) * stride, 0.0f), mean(N), rstd(N);
  float* d_ln = activation(ln);
  cpu_.layernorm_forward({.out = ln.data(), .mean = mean.data(), .rstd = rstd.data(),
                          .inp = x.data(), .weight = ln_weight.data(), .bias = ln_bias.data(),
                          .rows = N, .channels = C, .out_stride = stride});
  gpu_->layernorm_forward({.out = d_ln, .mean = poisoned(N), .rstd = poisoned(N),
                           .inp = activation(x), .weight = parameters(ln_weight),
                           .bias = parameters(ln_bias), .rows = N, .channels = C,
                           .out_stride = stride});
  expect_close("augmented layernorm out", d_ln, ln, tol_.rounding);
  const auto ln_rows = download(d_ln, ln.size());  // what both dense layers read

  for (int out_channels : {192, 256}) {
    const std::string label = " (" + std::to_string(out_channels) + " outputs)";
    const size_t weight_elems = size_t(out_channels) * C;
    const auto params = rounded(random_floats(weight_elems + out_channels, 43));
    float* d_params = parameters(params);
    const float *weight = params.data(), *bias = params.data() + weight_elems;
    std::vector<float> out(size_t(N) * out_channels);
    float* d_out = poisoned_activation(out.size());
    cpu_.matmul_forward({.out = out.data(), .inp = ln_rows.data(), .weight = weight, .bias = bias,
                         .rows = N, .in_channels = C, .out_channels = out_channels,
                         .inp_stride = stride});
    gpu_->matmul_forward({.out = d_out, .inp = d_ln, .weight = d_params,
                          .bias = d_params + weight_elems, .rows = N, .in_channels = C,
                          .out_channels = out_channels, .inp_stride = stride});
    expect_close("augmented matmul out" + label, d_out, out, gemm_tolerance(out));

    const auto dout = rounded(random_floats(out.size(), 44));
    auto dinp = rounded(random_floats(size_t(N) * C, 45));
    auto dweight = random_floats(weight_elems, 46), dbias = random_floats(out_channels, 47);
    std::vector<float> expected_dbias = double_column_sums(dout, N, out_channels);
    for (int o = 0; o < out_channels; ++o) expected_dbias[o] += dbias[o];
    float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
    const MatmulBackwardArgs<float> cpu_args{.dinp = dinp.data(), .dweight = dweight.data(),
                                             .dbias = dbias.data(), .dout = dout.data(),
                                             .inp = ln_rows.data(), .weight = weight, .rows = N,
                                             .in_channels = C, .out_channels = out_channels,
                                             .dinp_write = GradientWrite::overwrite,
                                             .inp_stride = stride};
    cpu_.matmul_backward(cpu_args);
    MatmulBackwardArgs<float> gpu_args = cpu_args;
    gpu_args.dinp = poisoned_activation(dinp.size());
    gpu_args.dweight = d_dweight;
    gpu_args.dbias = d_dbias;
    gpu_args.dout = activation(dout);
    gpu_args.inp = d_ln;
    gpu_args.weight = d_params;
    gpu_->matmul_backward(gpu_args);
    expect_close("augmented matmul dinp" + label, gpu_args.dinp, dinp, gemm_tolerance(dinp));
    expect_close("augmented matmul dweight" + label, d_dweight, dweight, kDotProduct);
    expect_close("augmented matmul dbias" + label, d_dbias, expected_dbias, kManyRowColumnSum);
  }
}

// GPT-2's dense layers take their bias in cuBLASLt's epilogue (no bias kernel), and the
// projections the residual stream's add as well: the epilogue must accept their shapes, or
// the step silently keeps the slower fallback.
// Where the operands are not 16-byte aligned it declines, and the GEMM-then-bias path
// (the Matmul test's tiny shape) runs instead. A timed choice of algorithm leaves the
// kept algorithm's results, as the heuristic's does.
TEST_P(CudaOpsHalf, BiasEpilogueTakesTheGpt2Shapes) {
  for (const bool timed : {false, true}) {
    cuda::LtGemm bias_gemm(timed);
    cudaStream_t stream = nullptr;
    CHECK_CUBLAS(cublasGetStream(gpu_->cublas_handle(), &stream));
    const cudaDataType_t type = precision_ == Precision::fp16 ? CUDA_R_16F : CUDA_R_16BF;
    const int N = 256;
    for (const auto& [in_channels, out_channels] :
         std::vector<std::pair<int, int>>{{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}}) {
      const std::string label = " (" + std::to_string(in_channels) + "->" +
                                std::to_string(out_channels) +
                                (timed ? ", timed" : "") + ")";
      const auto inp = rounded(random_floats(size_t(N) * in_channels, 37));
      const auto weight = rounded(random_floats(size_t(out_channels) * in_channels, 38));
      const auto bias = rounded(random_floats(size_t(out_channels), 39));
      std::vector<float> out(size_t(N) * out_channels);
      float* d_out = poisoned_activation(out.size());
      float* d_bias = activation(bias);  // a 16-bit bias, as the parameters' copy holds it
      ASSERT_TRUE(bias_gemm.forward(stream, type, {.out = d_out, .inp = activation(inp),
                                                   .weight = activation(weight), .bias = d_bias,
                                                   .rows = N, .in_channels = in_channels,
                                                   .out_channels = out_channels}))
          << "cuBLASLt declined the bias epilogue" << label;
      cpu_.matmul_forward({.out = out.data(), .inp = inp.data(), .weight = weight.data(),
                           .bias = bias.data(), .rows = N, .in_channels = in_channels,
                           .out_channels = out_channels});
      expect_close("bias epilogue out" + label, d_out, out, gemm_tolerance(out));
      // The projections add the residual stream in the same epilogue (C, beta = 1).
      const auto residual = rounded(random_floats(out.size(), 40));
      float* d_sum = poisoned_activation(out.size());
      ASSERT_TRUE(bias_gemm.forward(stream, type, {.out = d_sum, .inp = activation(inp),
                                                   .weight = activation(weight), .bias = d_bias,
                                                   .rows = N, .in_channels = in_channels,
                                                   .out_channels = out_channels,
                                                   .residual = activation(residual)}))
          << "cuBLASLt declined the bias epilogue with the residual" << label;
      const auto layer = download(d_out, out.size());
      std::vector<float> sum(out.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = layer[i] + residual[i];
      // Against the epilogue's own out without the residual: the same GEMM, so what remains is
      // the sum's one rounding (rtol) and the layer's, which the epilogue skips (atol).
      expect_close("bias epilogue out + residual" + label, d_sum, sum, gemm_tolerance(sum));
      const auto* misaligned_bias = reinterpret_cast<const char*>(d_bias) + 2;
      EXPECT_FALSE(bias_gemm.forward(stream, type, {.out = d_out, .inp = activation(inp),
                                                    .weight = activation(weight),
                                                    .bias = misaligned_bias, .rows = N,
                                                    .in_channels = in_channels,
                                                    .out_channels = out_channels}))
          << "a bias 2 bytes off 16-byte alignment must be declined" << label;
    }
  }
}

// Every LtGemm of a process runs the sizing that the first timed choice kept, so two
// of them compute the same bits and report the same choices, with both sizings' times.
TEST_P(CudaOpsHalf, TimedAlgorithmChoiceIsMadeOncePerProcess) {
  cudaStream_t stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(gpu_->cublas_handle(), &stream));
  const cudaDataType_t type = precision_ == Precision::fp16 ? CUDA_R_16F : CUDA_R_16BF;
  const int N = 4096, C = 768, OC = 3 * C;
  const float* d_inp = activation(rounded(random_floats(size_t(N) * C, 110)));
  const float* d_weight = activation(rounded(random_floats(size_t(OC) * C, 111)));
  const float* d_bias = activation(rounded(random_floats(size_t(OC), 112)));
  std::vector<std::vector<float>> outs;
  std::vector<std::vector<std::string>> reports;
  for (int instance = 0; instance < 2; ++instance) {
    cuda::LtGemm timed(true);
    float* d_out = poisoned_activation(size_t(N) * OC);
    ASSERT_TRUE(timed.forward(stream, type, {.out = d_out, .inp = d_inp, .weight = d_weight,
                                             .bias = d_bias, .rows = N, .in_channels = C,
                                             .out_channels = OC}));
    outs.push_back(download(d_out, size_t(N) * OC));
    reports.push_back(timed.algorithm_report());
  }
  ASSERT_EQ(reports[0].size(), 1u);
  EXPECT_NE(reports[0][0].find(" ms; for "), std::string::npos) << "both sizings timed: " << reports[0][0];
  EXPECT_EQ(reports[0], reports[1]);
  std::cout << "  " << name() << " " << reports[0][0] << "\n";
  EXPECT_TRUE(all_close("second timed LtGemm", outs[1], outs[0], kBitExact));
  cuda::LtGemm heuristic(false);
  float* d_out = poisoned_activation(size_t(N) * OC);
  ASSERT_TRUE(heuristic.forward(stream, type, {.out = d_out, .inp = d_inp,
                                               .weight = d_weight, .bias = d_bias, .rows = N,
                                               .in_channels = C, .out_channels = OC}));
  ASSERT_EQ(heuristic.algorithm_report().size(), 1u);
  EXPECT_EQ(heuristic.algorithm_report()[0].find("timed"), std::string::npos) << heuristic.algorithm_report()[0];
  EXPECT_NE(heuristic.algorithm_report()[0].find(": cuBLASLt's first"), std::string::npos);
  // A plan already sized for fewer multiprocessors (beside the overlapped lane) has no
  // other sizing to time.
  cuda::LtGemm beside_lane(true);
  int multiprocessors = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0));
  beside_lane.set_multiprocessor_target(multiprocessors - cuda::kTimedGemmFewerMultiprocessors);
  ASSERT_TRUE(beside_lane.forward(stream, type, {.out = d_out, .inp = d_inp,
                                                 .weight = d_weight, .bias = d_bias, .rows = N,
                                                 .in_channels = C, .out_channels = OC}));
  ASSERT_EQ(beside_lane.algorithm_report().size(), 1u);
  EXPECT_EQ(beside_lane.algorithm_report()[0].find("timed"), std::string::npos) << beside_lane.algorithm_report()[0];
}

// Names, for every GEMM it is asked about, the last of cuBLASLt's first four candidates
// (which the heuristic would not run), and keeps what it named.
class LastOfFourCandidates final : public cuda::GemmChooser {
 public:
  std::optional<std::string> choose(const cuda::GemmToChoose& gemm) override {
    const std::vector<cublasLtMatmulAlgo_t> candidates = cuda::lt_candidates(gemm.problem, 4);
    if (candidates.empty()) return std::nullopt;
    const std::string text = cuda::lt_algorithm_config(candidates.back());
    file.store(gemm.shape, text);
    return text;
  }
  cuda::GemmChoiceFile file;
};

// Every 16-bit GEMM of a dense layer and of the MLP runs the algorithm a chooser names for
// its shape: the plain GEMMs (which otherwise run cuBLAS's own) and those with an epilogue.
// Their results hold to the same tolerances against the CPU. A second backend reading the
// choices back from a file (--gemm-algos-file) runs them again.
TEST_P(CudaOpsHalf, ChosenAlgorithmsMatchTheCpu) {
  const std::string path = ::testing::TempDir() + "gemm_algos_" + name() + "_" + std::to_string(::getpid());
  const auto naming = std::make_shared<LastOfFourCandidates>();
  for (const bool from_file : {false, true}) {
    owned_.clear();  // the backend they came from frees them
    std::shared_ptr<cuda::GemmChooser> chooser = naming;
    if (from_file) {
      naming->file.write(path, cuda::gemm_machine(0));
      chooser = std::make_shared<cuda::GemmChoiceFile>(cuda::GemmChoiceFile::read(path, cuda::gemm_machine(0)));
    }
    gpu_ = std::make_unique<CudaOps>(0, precision_, GemmAlgos::heuristic, AttentionKernel::flash, chooser);
    const int N = 512;
    const std::string label = from_file ? " (from a file)" : " (chosen)";
    check_matmul({.in_channels = 768, .out_channels = 2304, .bias = true}, N);
    check_dense_gelu(N, 768, label);
    size_t plain = 0, with_epilogue = 0;
    for (const std::string& line : gpu_->algorithm_choices()) {
      std::cout << "  " << name() << label << " " << line << "\n";
      EXPECT_NE(line.find(", as chosen for this shape"), std::string::npos) << line;
      (line.rfind("plain ", 0) == 0 ? plain : with_epilogue) += 1;
    }
    // The input gradients (written, then added to) and the weight gradients of both layers.
    EXPECT_GE(plain, 4u) << "the plain GEMMs must take the chosen algorithms" << label;
    EXPECT_GE(with_epilogue, 1u) << "the bias epilogue at least (bf16 also takes the GELU's)" << label;
  }
  std::remove(path.c_str());
}

// ---- GPT-2's MLP GELU in cuBLASLt's epilogues ---------------------------------------------

// The dense-GELU pair against the CPU at the op shapes. The medium and odd shapes' channels
// are multiples of 8, which the epilogues need; the tiny shape's (C = 6) are not, so it
// runs the plain ops, which must agree just as well.
TEST_P(CudaOpsHalfShapes, DenseGelu) {
  const OpShape s = shape();
  const size_t fused = check_dense_gelu(s.rows(), s.channels, "");
  std::cout << "  " << name() << " GELU epilogue GEMMs: " << fused << " of 2\n";
  if (s.channels % 8 != 0 || precision_ == Precision::fp16) {
    EXPECT_EQ(fused, 0u) << "fp16, and channels that are not a multiple of 8, take the plain ops";
  }
}

// GPT-2 small's MLP (768 -> 3072 -> 768): in bf16 both ops must run in cuBLASLt's GELU
// epilogues, or the step silently keeps the GELU kernels and their passes over memory.
// fp16 keeps the GELU kernels: cuBLASLt's fp16 GELU misses the fp16 rounding
// (CudaOps::gelu_epilogues_allowed).
TEST_P(CudaOpsHalf, DenseGeluTakesTheEpiloguesAtGpt2Small) {
  const size_t expected = precision_ == Precision::bf16 ? 2 : 0;
  EXPECT_EQ(check_dense_gelu(256, 768, " (GPT-2 small, 256 rows)"), expected)
      << "bf16 must take both GELU epilogues at GPT-2 small's MLP shape, fp16 neither";
}

// In bf16 the GELU epilogue writes its output in augmented rows (gelu_output_stride), which
// the projection's backward reads for its bias gradient; fp16's GELU kernels write plain
// rows.
TEST_P(CudaOpsHalf, DenseGeluWritesAugmentedRowsWhereTheBackendSaysSo) {
  const int stride = gpu_->gelu_output_stride(4 * 768);
  if (precision_ == Precision::fp16) {
    EXPECT_EQ(stride, 0) << "fp16 keeps the GELU kernels, which write plain rows";
    return;
  }
  ASSERT_GE(stride, 4 * 768 + kAugmentedColumns);
  EXPECT_EQ(check_dense_gelu(256, 768, " (GPT-2 small, augmented)", stride), 2u)
      << "augmented rows need both GELU epilogues";
}

// The two epilogues at GPT-2 small's shapes, on inputs that make every GEMM exact, so that
// what is left to compare is the GELU itself: one-hot rows pick one weight (plus the bias)
// as the GELU's input, and a one-hot dout with weights of +-1 makes the derivative's
// multiplier exactly +-1. The fused GELU must be the tanh approximation (the CPU's); the
// inputs span [-5, 5], where the erf GELU fails the same checks (its value differs by up
// to 11 % near x = -3, its slope by more), which the test asserts as well. bf16 only: in
// fp16 cuBLASLt's GELU misses the fp16 rounding, so the backend keeps fp16 off these
// epilogues (CudaOps::gelu_epilogues_allowed). The algorithms are timed: every candidate
// runs on these operands, and the outputs checked are the kept one's. (The model tests
// run the heuristic's choice.)
TEST_F(CudaOpsBf16, GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu) {
  cuda::LtGemm epilogue_gemm(true);
  cudaStream_t stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(gpu_->cublas_handle(), &stream));
  const cudaDataType_t type = precision_ == Precision::fp16 ? CUDA_R_16F : CUDA_R_16BF;
  const int N = 256, C = 768, H = 4 * C;
  const size_t NH = size_t(N) * H;
  const double sqrt_two = std::sqrt(2.0), sqrt_two_pi = std::sqrt(2.0 * std::acos(-1.0));
  auto erf_gelu = [&](double x) { return 0.5 * x * (1.0 + std::erf(x / sqrt_two)); };
  auto erf_gelu_slope = [&](double x) {
    return 0.5 * (1.0 + std::erf(x / sqrt_two)) + x * std::exp(-0.5 * x * x) / sqrt_two_pi;
  };

  // Forward, 768 -> 3072: pre[n, o] = weight[o, n % C] + bias[o], exact in fp32.
  std::vector<float> inp(size_t(N) * C, 0.0f);
  for (int n = 0; n < N; ++n) inp[size_t(n) * C + n % C] = 1.0f;
  const auto weight = rounded(random_floats(size_t(H) * C, 90, -4.0f, 4.0f));
  const auto bias = rounded(random_floats(H, 91));
  std::vector<float> pre(NH);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < H; ++o) pre[size_t(n) * H + o] = weight[size_t(o) * C + n % C] + bias[o];
  float *d_pre = poisoned_activation(NH), *d_out = poisoned_activation(NH);
  const float *d_inp = activation(inp), *d_weight = activation(weight), *d_bias = activation(bias);
  ASSERT_TRUE(epilogue_gemm.gelu_forward(stream, type, {.pre = d_pre, .out = d_out, .inp = d_inp,
                                                        .weight = d_weight, .bias = d_bias,
                                                        .rows = N, .in_channels = C,
                                                        .out_channels = H}))
      << "cuBLASLt declined the GELU epilogue (768->3072)";
  expect_close("GELU epilogue pre (its auxiliary output)", d_pre, rounded(pre), kBitExact);
  std::vector<float> out(NH), erf_out(NH);
  cpu_.gelu_forward(out.data(), pre.data(), NH);
  for (size_t i = 0; i < NH; ++i) erf_out[i] = static_cast<float>(erf_gelu(pre[i]));
  expect_close("GELU epilogue out", d_out, out, tol_.rounding);
  EXPECT_FALSE(all_close("erf GELU", rounded(erf_out), out, tol_.rounding))
      << "these inputs must tell the erf GELU from the tanh GELU";
  void* misaligned_pre = reinterpret_cast<char*>(d_pre) + 2;
  EXPECT_FALSE(epilogue_gemm.gelu_forward(stream, type, {.pre = misaligned_pre, .out = d_out,
                                                         .inp = d_inp, .weight = d_weight,
                                                         .bias = d_bias, .rows = N,
                                                         .in_channels = C, .out_channels = H}))
      << "an auxiliary output 2 bytes off 16-byte alignment must be declined";

  // The input gradient of 3072 -> 768: dact[n, i] = proj_weight[n % C, i] = +-1.
  std::vector<float> dout(size_t(N) * C, 0.0f);
  for (int n = 0; n < N; ++n) dout[size_t(n) * C + n % C] = 1.0f;
  const auto signs = random_ids(size_t(C) * H, 92, 2);
  std::vector<float> proj_weight(signs.size());
  for (size_t i = 0; i < signs.size(); ++i) proj_weight[i] = signs[i] == 0 ? -1.0f : 1.0f;
  const auto gelu_input = rounded(random_floats(NH, 93, -5.0f, 5.0f));
  std::vector<float> dact(NH);
  for (int n = 0; n < N; ++n)
    std::copy_n(proj_weight.begin() + size_t(n % C) * H, H, dact.begin() + size_t(n) * H);
  std::vector<float> dpre(NH), erf_dpre(NH);
  cpu_.gelu_backward(dpre.data(), gelu_input.data(), dact.data(), NH, GradientWrite::overwrite);
  for (size_t i = 0; i < NH; ++i)
    erf_dpre[i] = static_cast<float>(erf_gelu_slope(gelu_input[i]) * dact[i]);
  float* d_dpre = poisoned_activation(NH);
  const float *d_dout = activation(dout), *d_proj_weight = activation(proj_weight);
  const float* d_gelu_input = activation(gelu_input);
  ASSERT_TRUE(epilogue_gemm.gelu_input_gradient(stream, type, {.dpre = d_dpre, .dout = d_dout,
                                                               .pre = d_gelu_input,
                                                               .weight = d_proj_weight, .rows = N,
                                                               .in_channels = H,
                                                               .out_channels = C}))
      << "cuBLASLt declined the GELU derivative's epilogue (3072->768)";
  expect_close("GELU epilogue dpre", d_dpre, dpre, tol_.gelu_backward);
  EXPECT_FALSE(all_close("erf GELU's derivative", rounded(erf_dpre), dpre, tol_.gelu_backward))
      << "these inputs must tell the erf GELU's derivative from the tanh GELU's";
  const void* misaligned_input = reinterpret_cast<const char*>(d_gelu_input) + 2;
  EXPECT_FALSE(epilogue_gemm.gelu_input_gradient(stream, type, {.dpre = d_dpre, .dout = d_dout,
                                                                .pre = misaligned_input,
                                                                .weight = d_proj_weight,
                                                                .rows = N, .in_channels = H,
                                                                .out_channels = C}))
      << "an auxiliary input 2 bytes off 16-byte alignment must be declined";
}

SCALESTUDY_SHAPE_TESTS();
SCALESTUDY_HALF_SHAPE_TESTS();
SCALESTUDY_HALF_PRECISION_TESTS();

}  // namespace
}  // namespace scalestudy::gpu_test
