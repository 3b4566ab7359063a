// The project's Hopper GEMM for GPT-2's two GELU GEMMs (kernels/sm90/gelu_gemm.cuh): in the
// backend's dense-GELU pair against the CPU at GPT-2 small's MLP shape, through the
// backend, and on its own, where its bits must not depend on how many CTAs share the
// tiles. bf16 on an sm_90 device only; elsewhere the tests skip, since the
// kernel declines every call there (which DeclinesWhatItDoesNotTake checks everywhere).
#include "cuda_ops_fixture.h"
#include "gemm_lt.cuh"
#include "sm90/gelu_gemm.cuh"

namespace scalestudy::gpu_test {
namespace {

bool device_is_hopper() {
  int major = 0, minor = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  return major == 9 && minor == 0;
}

bool reports_hopper_kernel(const std::vector<std::string>& lines, const std::string& epilogue) {
  for (const std::string& line : lines)
    if (line.rfind(epilogue + " ", 0) == 0 && line.find("the Hopper kernel") != std::string::npos)
      return true;
  return false;
}

// GPT-2 small's MLP (768 -> 3072) and medium's (1024 -> 4096) through the backend, against
// the CPU with the tolerances of every dense-GELU check (check_dense_gelu), whose parameter
// gradients' bound holds up to 1024 rows: 96 and 128 tiles of 128 x 256, under one for
// each multiprocessor.
TEST_F(CudaOpsBf16, HopperGeluGemmsRunTheMlpAgainstTheCpu) {
  if (!device_is_hopper()) GTEST_SKIP() << "the Hopper GEMM runs on sm_90 devices only";
  EXPECT_EQ(check_dense_gelu(1024, 768, " (C=768, 1024 rows)"), 2u);
  EXPECT_EQ(check_dense_gelu(1024, 1024, " (C=1024, 1024 rows)"), 2u);
  const auto report = gpu_->algorithm_choices();
  EXPECT_TRUE(reports_hopper_kernel(report, "gelu_aux_bias")) << "the forward took cuBLASLt";
  EXPECT_TRUE(reports_hopper_kernel(report, "dgelu")) << "the input gradient took cuBLASLt";
}

// Both epilogues on one CTA (96 tiles, the ring through 384 rounds, the input gradient's
// side buffers through 384 loads each), against the CPU with check_dense_gelu's tolerances,
// and the same call on the whole device gives the same bits: each output is one sum in a
// fixed order, whoever computes it.
TEST_F(CudaOpsBf16, HopperGeluGemmOnOneCtaAndOnTheDevice) {
  if (!device_is_hopper()) GTEST_SKIP() << "the Hopper GEMM runs on sm_90 devices only";
  cudaStream_t stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(gpu_->cublas_handle(), &stream));
  const int rows = 1024, columns = 3072, depth = 768;
  const size_t out_elems = size_t(rows) * columns;
  const auto a = rounded(random_floats(size_t(rows) * depth, 120));
  const auto b = rounded(random_floats(size_t(columns) * depth, 121, -0.1f, 0.1f));
  const auto bias = rounded(random_floats(size_t(columns), 122));
  const auto pre_in = rounded(random_floats(out_elems, 123, -4.0f, 4.0f));
  // The CPU's: pre and gelu(pre) of the forward, and a b^T, whose GELU derivative at pre_in
  // is the input gradient's.
  std::vector<float> pre(out_elems), out(out_elems), product(out_elems), dpre(out_elems);
  cpu_.dense_gelu_forward({.pre = pre.data(), .out = out.data(), .inp = a.data(),
                           .weight = b.data(), .bias = bias.data(), .rows = rows,
                           .in_channels = depth, .out_channels = columns});
  cpu_.matmul_forward(product.data(), a.data(), b.data(), nullptr, rows, depth, columns);
  cpu_.gelu_backward(dpre.data(), pre_in.data(), product.data(), out_elems,
                     GradientWrite::overwrite);
  const float *d_a = activation(a), *d_b = activation(b), *d_bias = activation(bias);
  const float* d_pre_in = activation(pre_in);
  cuda::sm90::GeluGemm gemm;
  for (const auto epilogue : {cuda::sm90::GeluEpilogue::forward,
                              cuda::sm90::GeluEpilogue::input_gradient}) {
    const bool forward = epilogue == cuda::sm90::GeluEpilogue::forward;
    std::vector<std::vector<float>> outs, pres;
    for (const int ctas : {1, 0}) {
      float* d_out = poisoned_activation(out_elems);
      float* d_pre = forward ? poisoned_activation(out_elems) : const_cast<float*>(d_pre_in);
      const cuda::sm90::GeluGemmCall call{epilogue, rows, columns, depth, d_a, d_b, d_out, d_pre,
                                          forward ? d_bias : nullptr};
      ASSERT_TRUE(gemm.takes(call));
      gemm.run(stream, call, ctas);
      outs.push_back(download(d_out, out_elems));
      if (forward) pres.push_back(download(d_pre, out_elems));
    }
    if (forward) {
      EXPECT_TRUE(all_close("forward pre on one CTA", pres[0], pre, gemm_tolerance(pre)));
      EXPECT_TRUE(all_close("forward out on one CTA", outs[0], out,
                            gelu_of_gemm_tolerance(pre)));
      EXPECT_TRUE(all_close("forward pre on the device", pres[1], pres[0], kBitExact));
    } else {
      EXPECT_TRUE(all_close("input gradient on one CTA", outs[0], dpre,
                            gelu_of_gemm_tolerance(product)));
    }
    const std::string label = forward ? "forward out" : "input gradient";
    EXPECT_TRUE(all_close(label + " on the device", outs[1], outs[0], kBitExact));
  }
}

// Shapes off the tiles, misaligned operands and a missing bias or pre are declined (the
// caller runs cuBLASLt), and so is every call on a device that is not sm_90.
TEST_F(CudaOpsBf16, HopperGeluGemmDeclinesWhatItDoesNotTake) {
  cuda::sm90::GeluGemm gemm;
  const float* d_a = activation(std::vector<float>(size_t(256) * 192, 0.0f));
  const float* d_b = activation(std::vector<float>(size_t(512) * 192, 0.0f));
  float* d_out = poisoned_activation(size_t(256) * 512);
  float* d_pre = poisoned_activation(size_t(256) * 512);
  const float* d_bias = activation(std::vector<float>(512, 0.0f));
  const cuda::sm90::GeluGemmCall fits{cuda::sm90::GeluEpilogue::forward, 256, 512, 192, d_a, d_b,
                                      d_out, d_pre, d_bias};
  EXPECT_EQ(gemm.takes(fits), device_is_hopper());
  auto off = fits;
  off.rows = 192;
  EXPECT_FALSE(gemm.takes(off)) << "rows not a multiple of 128";
  off = fits;
  off.columns = 384;
  EXPECT_FALSE(gemm.takes(off)) << "columns not a multiple of 256";
  off = fits;
  off.depth = 224;
  EXPECT_FALSE(gemm.takes(off)) << "depth not a multiple of 64";
  off.depth = 128;
  EXPECT_FALSE(gemm.takes(off)) << "depth under three slices of 64";
  off = fits;
  off.out = reinterpret_cast<char*>(d_out) + 2;
  EXPECT_FALSE(gemm.takes(off)) << "an output 2 bytes off 16-byte alignment";
  off = fits;
  off.bias = nullptr;
  EXPECT_FALSE(gemm.takes(off)) << "a forward without its bias";
  off = fits;
  off.epilogue = cuda::sm90::GeluEpilogue::input_gradient;
  off.pre = nullptr;
  EXPECT_FALSE(gemm.takes(off)) << "an input gradient without pre";
}

}  // namespace
}  // namespace scalestudy::gpu_test
