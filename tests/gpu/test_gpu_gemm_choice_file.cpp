// The file of GEMM algorithms that --gemm-algos-file reads (kernels/gemm_choice_file.cuh):
// the text form it keeps gives back the same algorithm, malformed or refused texts give
// none; what one writes the next reads, a file of another machine is set aside whole, a
// shape stored twice keeps its last algorithm, and a malformed file is refused naming its
// line. The configurations near the heuristic's candidates that `scalestudy gemm-search`
// times (kernels/gemm_search.cuh) are new ones that compute the same GEMM, and its chooser
// writes each choice into the file as it makes it and keeps the choices the file holds.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/device_info.h"
#include "backend/cuda/half_host.h"
#include "cuda_check.h"
#include "gemm_choice_file.cuh"
#include "gemm_search.cuh"
#include "op_checks.h"
#include "scratch_folder.h"

namespace scalestudy::gpu_test {
namespace {

// C[m, n] = A[m, k] · B[k, n] in bf16, column-major, with fp32 accumulation. The entries are
// integers in [-2, 2], so every partial sum (at most 4 k = 3072 in magnitude) is exact in
// fp32 whatever the order, and every algorithm must give the same bits.
class LtAlgorithms : public ScratchFolder {
 protected:
  static constexpr int m = 768, n = 512, k = 768;
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  void SetUp() override {
    ScratchFolder::SetUp();
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
    ScratchFolder::TearDown();
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

std::string contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The search's mechanics on one GEMM, with windows of a few milliseconds (the real ones
// take tens of seconds a shape): the choice is an algorithm this cuBLASLt accepts and that
// computes the same bits, it is in the file as soon as it is made, and a shape the file
// holds is answered from it without timing.
TEST_F(LtAlgorithms, TheSustainedChooserWritesEachChoiceAndKeepsTheFilesChoices) {
  const std::string path = this->path("sustained");
  const std::string machine = "this GPU | this cuBLASLt";
  const cublasLtMatmulAlgo_t first = cuda::lt_candidates(problem_, 1).at(0);
  const cuda::LtLaunch launch_with = [this](const cublasLtMatmulAlgo_t& algo) { return launch(algo); };
  const cuda::GemmToChoose gemm{"bias bf16 m=768 n=512 k=768", problem_, stream_, launch_with,
                                [&] { return launch(first); }, false};
  cuda::GemmChoiceFile file;
  int reports = 0;
  cuda::SustainedChooser chooser(file, path, machine, cuda::SustainedTiming{2.0, 4.0},
                                 [&](const cuda::SustainedChoiceMade& made) {
                                   ++reports;
                                   EXPECT_EQ(made.shape, gemm.shape);
                                   EXPECT_GT(made.kept_ms, 0.0);
                                   EXPECT_GT(made.default_ms, 0.0);
                                 });
  const std::optional<std::string> chosen = chooser.choose(gemm);
  ASSERT_TRUE(chosen.has_value());
  const auto algo = cuda::lt_algorithm_of(problem_, *chosen);
  ASSERT_TRUE(algo.has_value()) << *chosen;
  EXPECT_EQ(product(*algo), product(first)) << *chosen;
  EXPECT_EQ(contents(path), "scalestudy gemm algorithms for " + machine + "\n" + gemm.shape + "\t" + *chosen + "\n");
  EXPECT_EQ(chooser.searched(), 1);
  EXPECT_EQ(reports, 1);

  cuda::GemmChoiceFile held;
  held.store(gemm.shape, "lt id=1");
  cuda::SustainedChooser resumed(held, path, machine, cuda::SustainedTiming{2.0, 4.0});
  EXPECT_EQ(resumed.choose(gemm), "lt id=1") << "a shape the file holds keeps its choice";
  EXPECT_EQ(resumed.searched(), 0);
}

constexpr const char* kH200 = "NVIDIA H200 | cuBLASLt 130100";

// The file tests need no GPU, only a folder of their own.
using GemmChoiceFileOnDisk = ScratchFolder;

TEST_F(GemmChoiceFileOnDisk, WhatOneWritesTheNextReads) {
  const std::string path = this->path("round_trip");
  cuda::GemmChoiceFile first;
  first.store("plain bf16 m=768 n=65536 k=2304", "lt id=66 tile=29 stages=35");
  first.store("bias bf16 m=2304 n=65536 k=768", "lt id=66 tile=24 stages=35");
  first.store("plain bf16 m=768 n=65536 k=2304", "cublas");
  first.write(path, kH200);
  EXPECT_EQ(contents(path),
            "scalestudy gemm algorithms for NVIDIA H200 | cuBLASLt 130100\n"
            "bias bf16 m=2304 n=65536 k=768\tlt id=66 tile=24 stages=35\n"
            "plain bf16 m=768 n=65536 k=2304\tcublas\n");
  const cuda::GemmChoiceFile second = cuda::GemmChoiceFile::read(path, kH200);
  EXPECT_TRUE(second.set_aside_because().empty());
  EXPECT_EQ(second.size(), 2u);
  EXPECT_EQ(second.find("plain bf16 m=768 n=65536 k=2304"), "cublas") << "the last store wins";
  EXPECT_EQ(second.find("bias bf16 m=2304 n=65536 k=768"), "lt id=66 tile=24 stages=35");
  EXPECT_FALSE(second.find("plain bf16 m=768 n=65536 k=768").has_value());
}

TEST_F(GemmChoiceFileOnDisk, AFileOfAnotherMachineIsSetAside) {
  const std::string path = this->path("other_machine");
  cuda::GemmChoiceFile made;
  made.store("shape", "lt id=1");
  made.write(path, "NVIDIA H100 80GB HBM3 | cuBLASLt 130100");
  const cuda::GemmChoiceFile here = cuda::GemmChoiceFile::read(path, kH200);
  EXPECT_EQ(here.size(), 0u);
  EXPECT_NE(here.set_aside_because().find("made for NVIDIA H100 80GB HBM3"), std::string::npos)
      << here.set_aside_because();
}

TEST_F(GemmChoiceFileOnDisk, AMalformedOrMissingFileIsRefusedNamingTheFileAndLine) {
  const std::string path = this->path("malformed");
  const auto refusal = [&](const std::string& text) -> std::string {
    write("malformed", text);
    try {
      cuda::GemmChoiceFile::read(path, kH200);
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "not refused";
  };
  EXPECT_EQ(refusal("gemm algorithms\n"), path + ": line 1 must be \"scalestudy gemm algorithms for <machine>\"");
  const std::string header = std::string("scalestudy gemm algorithms for ") + kH200 + "\n";
  EXPECT_EQ(refusal(header + "shape\tcublas\nno tab\n"), path + ": line 3 must be <shape><TAB><algorithm>");
  EXPECT_EQ(refusal(header + "a\tb\tc\n"), path + ": line 2 must be <shape><TAB><algorithm>");
  EXPECT_EQ(refusal(header + "\tcublas\n"), path + ": line 2 must be <shape><TAB><algorithm>");
  std::filesystem::remove(path);
  try {
    cuda::GemmChoiceFile::read(path, kH200);
    ADD_FAILURE() << "a missing file is read";
  } catch (const std::invalid_argument& error) {
    EXPECT_EQ(std::string(error.what()), path + ": cannot be read");
  }
  EXPECT_THROW(cuda::GemmChoiceFile().store("two\tfields", "cublas"), std::invalid_argument);
}

}  // namespace
}  // namespace scalestudy::gpu_test
