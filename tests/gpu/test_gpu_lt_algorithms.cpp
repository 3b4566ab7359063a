// cuBLASLt's algorithms as --gemm-algos sustained takes them (kernels/lt_algorithms.cuh):
// the text form --gemm-algos-file keeps gives back the same algorithm, malformed or
// refused texts give none, and the configurations near the heuristic's candidates are new
// ones that compute the same GEMM.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/half_host.h"
#include "cuda_check.h"
#include "lt_algorithms.cuh"
#include "op_checks.h"

namespace scalestudy::gpu_test {
namespace {

// C[m, n] = A[m, k] · B[k, n] in bf16, column-major, with fp32 accumulation. The entries are
// integers in [-2, 2], so every partial sum (at most 4 k = 3072 in magnitude) is exact in
// fp32 whatever the order, and every algorithm must give the same bits.
class LtAlgorithms : public ::testing::Test {
 protected:
  static constexpr int m = 768, n = 512, k = 768;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
    CHECK_CUBLAS(cublasLtCreate(&problem_.handle));
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&problem_.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&problem_.a, CUDA_R_16BF, m, k, m));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&problem_.b, CUDA_R_16BF, k, n, k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&problem_.c, CUDA_R_16BF, m, n, m));
    problem_.workspace_bytes = kWorkspaceBytes;
    a_ = upload_integers(size_t{m} * k, 1);
    b_ = upload_integers(size_t{k} * n, 2);
    CHECK_CUDA(cudaMalloc(&c_, size_t{m} * n * sizeof(uint16_t)));
    CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
    CHECK_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (problem_.handle == nullptr) return;
    for (void* buffer : {a_, b_, c_, workspace_}) CHECK_CUDA(cudaFree(buffer));
    CHECK_CUDA(cudaStreamDestroy(stream_));
    for (cublasLtMatrixLayout_t layout : {problem_.a, problem_.b, problem_.c})
      CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(layout));
    CHECK_CUBLAS(cublasLtMatmulDescDestroy(problem_.desc));
    CHECK_CUBLAS(cublasLtDestroy(problem_.handle));
  }

  static void* upload_integers(size_t elems, uint64_t seed) {
    op_test::Rng rng(seed);
    std::vector<uint16_t> bits(elems);
    for (uint16_t& value : bits) value = bf16_bits_from_float(static_cast<float>(rng.next() % 5) - 2.0f);
    void* device = nullptr;
    CHECK_CUDA(cudaMalloc(&device, elems * sizeof(uint16_t)));
    CHECK_CUDA(cudaMemcpy(device, bits.data(), elems * sizeof(uint16_t), cudaMemcpyHostToDevice));
    return device;
  }

  cublasStatus_t launch(const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(problem_.handle, problem_.desc, &alpha, a_, problem_.a, b_, problem_.b, &beta, c_,
                          problem_.c, c_, problem_.c, &algo, workspace_, kWorkspaceBytes, stream_);
  }
  std::vector<uint16_t> product(const cublasLtMatmulAlgo_t& algo) {
    CHECK_CUDA(cudaMemsetAsync(c_, 0xff, size_t{m} * n * sizeof(uint16_t), stream_));
    CHECK_CUBLAS(launch(algo));
    std::vector<uint16_t> bits(size_t{m} * n);
    CHECK_CUDA(cudaMemcpyAsync(bits.data(), c_, bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    return bits;
  }

  cuda::LtProblem problem_;
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr, *workspace_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(LtAlgorithms, TheTextFormGivesBackTheSameAlgorithm) {
  const std::vector<cublasLtMatmulAlgo_t> candidates = cuda::lt_candidates(problem_, 8);
  ASSERT_FALSE(candidates.empty());
  for (const cublasLtMatmulAlgo_t& candidate : candidates) {
    const std::string config = cuda::lt_algorithm_config(candidate);
    const auto again = cuda::lt_algorithm_of(problem_, config);
    ASSERT_TRUE(again.has_value()) << config;
    EXPECT_EQ(cuda::lt_algorithm_config(*again), config);
    EXPECT_EQ(product(*again), product(candidate)) << config;
  }
}

TEST_F(LtAlgorithms, MalformedOrRefusedTextsGiveNone) {
  const std::string config = cuda::lt_algorithm_config(cuda::lt_candidates(problem_, 1).at(0));
  const std::string tile = config.substr(config.find(" tile="), config.find(" stages=") - config.find(" tile="));
  for (const std::string& text :
       {std::string("cublas"), std::string(), config.substr(0, config.size() - 2), config + " extra=1",
        "lt" + config.substr(config.find(" tile=")),  // no id
        std::string(config).replace(config.find(tile), tile.size(), " tile=x"),
        std::string(config).replace(config.find(tile), tile.size(), " tile=999999")})
    EXPECT_FALSE(cuda::lt_algorithm_of(problem_, text).has_value()) << "'" << text << "'";
}

TEST_F(LtAlgorithms, ConfigurationsNearTheCandidatesAreNewAndComputeTheSame) {
  const std::vector<cublasLtMatmulAlgo_t> candidates = cuda::lt_candidates(problem_, 8);
  ASSERT_FALSE(candidates.empty());
  const std::vector<cublasLtMatmulAlgo_t> near = cuda::lt_neighbours(
      problem_, candidates, stream_, [this](const cublasLtMatmulAlgo_t& algo) { return launch(algo); });
  std::set<std::string> offered;
  for (const cublasLtMatmulAlgo_t& candidate : candidates) offered.insert(cuda::lt_algorithm_config(candidate));
  EXPECT_GE(near.size(), 1u) << "a GEMM of this size has other tiles than the heuristic's";
  EXPECT_LE(near.size(), static_cast<size_t>(cuda::kNeighbourConfigurations));
  const std::vector<uint16_t> expected = product(candidates.front());
  std::set<std::string> seen;
  for (const cublasLtMatmulAlgo_t& algo : near) {
    const std::string config = cuda::lt_algorithm_config(algo);
    std::cout << "  near: " << config << "\n";
    EXPECT_EQ(offered.count(config), 0u) << config;
    EXPECT_TRUE(seen.insert(config).second) << "returned twice: " << config;
    EXPECT_TRUE(cuda::lt_algorithm_of(problem_, config).has_value()) << config;
    EXPECT_EQ(product(algo), expected) << config;
  }
}

}  // namespace
}  // namespace scalestudy::gpu_test
