// The GEMMs of GPT-2 small's training step at batch 64 in bf16, each as the step runs it
// and through each of cuBLASLt's first candidates for it: the time of a call alone and,
// with OP_TIMINGS_ENERGY set, its energy at the power the GPU settles at when the call
// runs for a second (energy_per_call.h). On a power-capped GPU the step lasts about its
// energy over the cap, so the candidate that spends least is the one the step would gain
// from. The step's choice and the least-spending candidate are then measured again,
// alternated, because the least of several noisy figures is biased low.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/half_host.h"
#include "cuda_check.h"
#include "energy_per_call.h"
#include "lt_candidates.h"
#include "trial_times.h"
#include "op_checks.h"

namespace scalestudy::gpu_test {
namespace {

using op_test::Rng;

struct StepGemm {
  const char* name;
  double calls_per_step;
  LtGemmShape shape;
  float beta;
  bool step_uses_lt;  // the step runs cuBLASLt's first candidate; otherwise cublasGemmEx
};

// A device buffer of `elems` bf16 values, uniform in [-1, 1), from a 16 M-value pattern.
void* random_bf16(size_t elems, uint64_t seed) {
  constexpr size_t kPatternElems = size_t{1} << 24;
  Rng rng(seed);
  std::vector<uint16_t> pattern(std::min(elems, kPatternElems));
  for (uint16_t& value : pattern) value = bf16_bits_from_float(rng.uniform(-1.0f, 1.0f));
  void* buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&buffer, elems * sizeof(uint16_t)));
  for (size_t first = 0; first < elems; first += pattern.size())
    CHECK_CUDA(cudaMemcpy(static_cast<uint16_t*>(buffer) + first, pattern.data(),
                          std::min(pattern.size(), elems - first) * sizeof(uint16_t),
                          cudaMemcpyHostToDevice));
  return buffer;
}

// GPT-2 small's step GEMMs at batch 64 (65536 rows), in cuBLAS's column-major terms
// (kernels/matmul.cu): forwards (T, N; m = out, k = in), input gradients (N, N; m = in,
// k = out, written), weight gradients (N, T; m = in, n = out, k = rows, added to fp32).
// The LM head runs on row chunks of 42690 (2^31 elements of 50304-element logit rows).
std::vector<StepGemm> step_gemms(void* bias, void* aux) {
  const int rows = 65536, C = 768, H = 4 * C, vocab = 50256, logits_stride = 50304;
  const int head_rows = 42690;
  const double layers = 12, head_chunks = double(rows) / head_rows;
  auto forward = [&](int in, int out) {
    return LtGemmShape{CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, in, in, out};
  };
  auto input_gradient = [&](int in, int out) {
    return LtGemmShape{CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, in, out, in};
  };
  auto weight_gradient = [&](int in, int out, int k, int dout_ld) {
    LtGemmShape shape{CUBLAS_OP_N, CUBLAS_OP_T, in, out, k, in, dout_ld, in};
    shape.c_type = CUDA_R_32F;
    return shape;
  };
  auto with_epilogue = [&](LtGemmShape shape, cublasLtEpilogue_t epilogue, bool has_aux) {
    shape.epilogue = epilogue;
    shape.bias = epilogue == CUBLASLT_EPILOGUE_DGELU ? nullptr : bias;
    shape.aux = has_aux ? aux : nullptr;
    return shape;
  };
  LtGemmShape head_forward{CUBLAS_OP_T, CUBLAS_OP_N, vocab, head_rows, C, C, C, logits_stride};
  LtGemmShape head_input_gradient{CUBLAS_OP_N, CUBLAS_OP_N, C, head_rows, vocab, C, logits_stride, C};
  return {
      {"qkv forward, bias", layers, with_epilogue(forward(C, 3 * C), CUBLASLT_EPILOGUE_BIAS, false), 0, true},
      {"attn_proj forward, bias", layers, with_epilogue(forward(C, C), CUBLASLT_EPILOGUE_BIAS, false), 0, true},
      {"fc forward, GELU, pre stored", layers,
       with_epilogue(forward(C, H), CUBLASLT_EPILOGUE_GELU_AUX_BIAS, true), 0, true},
      {"fc_proj forward, bias", layers, with_epilogue(forward(H, C), CUBLASLT_EPILOGUE_BIAS, false), 0, true},
      {"qkv input gradient", layers, input_gradient(C, 3 * C), 0, false},
      {"attn_proj input gradient", layers, input_gradient(C, C), 0, false},
      {"fc input gradient", layers, input_gradient(C, H), 0, false},
      {"fc_proj input gradient, DGELU", layers,
       with_epilogue(input_gradient(H, C), CUBLASLT_EPILOGUE_DGELU, true), 0, true},
      {"qkv weight gradient", layers, weight_gradient(C, 3 * C, rows, 3 * C), 1, false},
      {"attn_proj weight gradient", layers, weight_gradient(C, C, rows, C), 1, false},
      {"fc weight gradient", layers, weight_gradient(C, H, rows, H), 1, false},
      {"fc_proj weight gradient", layers, weight_gradient(H, C, rows, C), 1, false},
      {"LM head forward (a chunk)", head_chunks, head_forward, 0, false},
      {"LM head input gradient (a chunk)", head_chunks, head_input_gradient, 0, false},
      {"LM head weight gradient (a chunk)", head_chunks, weight_gradient(C, vocab, head_rows, logits_stride), 1,
       false},
  };
}
// Energy in mJ a call, or 0 where it is not measured.
double mj_per_call(cudaStream_t stream, double ms, const std::function<void()>& call) {
  const std::optional<CallEnergy> energy = energy_per_call(stream, ms, call);
  return energy ? energy->mj_per_call : 0.0;
}

// The operands, workspace, stream and handles every step GEMM here runs with.
struct StepGemmBench {
  static constexpr size_t kLargestElems = size_t{42690} * 50304, kWorkspaceBytes = size_t{32} << 20;
  void* a = random_bf16(size_t{65536} * 3072, 1);
  void* b = random_bf16(kLargestElems, 2);
  void* c = random_bf16(kLargestElems, 3);
  void* aux = random_bf16(size_t{65536} * 3072, 4);
  void* bias = random_bf16(3072, 5);
  void* c_fp32 = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;

  StepGemmBench() {
    CHECK_CUDA(cudaMalloc(&c_fp32, size_t{50304} * 768 * sizeof(float)));
    CHECK_CUDA(cudaMemset(c_fp32, 0, size_t{50304} * 768 * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));
    CHECK_CUDA(cudaStreamCreate(&stream));
    CHECK_CUBLAS(cublasCreate(&blas));
    CHECK_CUBLAS(cublasSetStream(blas, stream));
    CHECK_CUBLAS(cublasLtCreate(&lt));
  }
  ~StepGemmBench() {
    CHECK_CUBLAS(cublasLtDestroy(lt));
    CHECK_CUBLAS(cublasDestroy(blas));
    CHECK_CUDA(cudaStreamDestroy(stream));
    for (void* buffer : {a, b, c, aux, bias, c_fp32, workspace}) CHECK_CUDA(cudaFree(buffer));
  }
  StepGemmBench(const StepGemmBench&) = delete;
  StepGemmBench& operator=(const StepGemmBench&) = delete;

  void* out(const StepGemm& gemm) const { return gemm.shape.c_type == CUDA_R_32F ? c_fp32 : c; }
  // A call through the candidate of this rank, with cuBLAS's status.
  cuda::GemmLaunch candidate(const LtCandidates& candidates, const StepGemm& gemm, int rank) const {
    return [this, &candidates, &gemm, rank] {
      return candidates.launch(rank, a, b, gemm.beta, out(gemm), workspace, kWorkspaceBytes, stream);
    };
  }
  // A call as the step makes it.
  cuda::GemmLaunch step_call(const LtCandidates& candidates, const StepGemm& gemm) const {
    if (gemm.step_uses_lt) return candidate(candidates, gemm, 0);
    return [this, &gemm] {
      const LtGemmShape& shape = gemm.shape;
      const float alpha = 1.0f;
      return cublasGemmEx(blas, shape.op_a, shape.op_b, shape.m, shape.n, shape.k, &alpha, a, shape.ab_type,
                          shape.lda, b, shape.ab_type, shape.ldb, &gemm.beta, out(gemm), shape.c_type,
                          shape.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
  }
};

bool no_gpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0;
}

std::function<void()> checked(cuda::GemmLaunch launch) {
  return [launch = std::move(launch)] { CHECK_CUBLAS(launch()); };
}

TEST(StepGemmEnergy, Gpt2SmallBatch64) {
  if (no_gpu()) GTEST_SKIP() << "no GPU";
  constexpr int kCandidates = 8;
  StepGemmBench bench;
  const cudaStream_t stream = bench.stream;
  double step_mj = 0.0, saved_mj = 0.0;

  std::cout << std::fixed << std::setprecision(3);
  for (const StepGemm& gemm : step_gemms(bench.bias, bench.aux)) {
    const LtGemmShape& shape = gemm.shape;
    const LtCandidates candidates(bench.lt, shape, StepGemmBench::kWorkspaceBytes, kCandidates);
    const auto candidate = [&](int rank) { return checked(bench.candidate(candidates, gemm, rank)); };
    const std::function<void()> step_call = checked(bench.step_call(candidates, gemm));
    const double flops = 2.0 * shape.m * shape.n * shape.k;
    std::cout << gemm.name << " (m=" << shape.m << " n=" << shape.n << " k=" << shape.k << ", "
              << gemm.calls_per_step << " a step), " << candidates.count() << " candidates\n";
    const double step_ms = time_trials(stream, 10, step_call).median_ms;
    const double step_first_mj = mj_per_call(stream, step_ms, step_call);
    std::cout << "  the step's " << (gemm.step_uses_lt ? "(cuBLASLt #0)" : "(cublasGemmEx)") << ": "
              << step_ms << " ms, " << flops / step_ms / 1e9 << " TFLOP/s, " << step_first_mj << " mJ\n";
    int least_rank = -1;
    double least_mj = step_first_mj, least_ms = step_ms;
    for (int rank = 0; rank < candidates.count(); ++rank) {
      const double ms = time_trials(stream, 10, candidate(rank)).median_ms;
      const double mj = mj_per_call(stream, ms, candidate(rank));
      std::cout << "  #" << rank << " " << candidates.config(rank) << ": " << ms << " ms, " << flops / ms / 1e9
                << " TFLOP/s, " << mj << " mJ\n";
      if (mj > 0.0 && mj < least_mj) least_rank = rank, least_mj = mj, least_ms = ms;
    }
    // Alternated twice more: the step's choice, then the least-spending candidate.
    double step_again_mj = 0.0, least_again_mj = 0.0;
    for (int round = 0; round < 2; ++round) {
      step_again_mj += mj_per_call(stream, step_ms, step_call) / 2;
      if (least_rank >= 0) least_again_mj += mj_per_call(stream, least_ms, candidate(least_rank)) / 2;
    }
    if (least_rank < 0) least_again_mj = step_again_mj;
    step_mj += gemm.calls_per_step * step_again_mj;
    saved_mj += gemm.calls_per_step * (step_again_mj - least_again_mj);
    std::cout << "  again, alternated: the step's " << step_again_mj << " mJ, #" << least_rank << " "
              << least_again_mj << " mJ (" << 100.0 * (1.0 - least_again_mj / step_again_mj) << " % less)\n";
  }
  std::cout << "the step's GEMMs: " << step_mj << " mJ a step; the least-spending candidates save "
            << saved_mj << " mJ (" << 100.0 * saved_mj / step_mj << " % of that)\n";
}

// Beyond the heuristic's candidates: the configurations near them that
// dev/gemm_search searches (gemm_search::lt_neighbours), under sustained load
// (gemm_search::choose_sustained) beside the step's own and the heuristic's first eight, as the
// option runs them; then the best of the heuristic's is timed once more against the best
// of the others. STEP_GEMMS="0,2,7" limits it to those of the list.
TEST(StepGemmConfigurations, Gpt2SmallBatch64) {
  if (no_gpu()) GTEST_SKIP() << "no GPU";
  constexpr int kCandidates = 8;
  StepGemmBench bench;
  const cudaStream_t stream = bench.stream;
  const char* only = std::getenv("STEP_GEMMS");
  const std::string chosen = only != nullptr ? std::string(",") + only + "," : "";
  double heuristic_ms = 0.0, best_ms = 0.0;

  std::cout << std::fixed << std::setprecision(4);
  const std::vector<StepGemm> gemms = step_gemms(bench.bias, bench.aux);
  for (int index = 0; index < static_cast<int>(gemms.size()); ++index) {
    if (!chosen.empty() && chosen.find("," + std::to_string(index) + ",") == std::string::npos) continue;
    const StepGemm& gemm = gemms[index];
    LtCandidates candidates(bench.lt, gemm.shape, StepGemmBench::kWorkspaceBytes, kCandidates);
    const int heuristic_count = candidates.count();
    const auto started = std::chrono::steady_clock::now();
    const cuda::LtLaunch launch_with = [&](const cublasLtMatmulAlgo_t& algo) {
      return candidates.launch(algo, bench.a, bench.b, gemm.beta, bench.out(gemm), bench.workspace,
                               StepGemmBench::kWorkspaceBytes, stream);
    };
    const std::vector<cublasLtMatmulAlgo_t> near =
        gemm_search::lt_neighbours(candidates.problem(StepGemmBench::kWorkspaceBytes), candidates.algorithms(),
                            stream, launch_with);
    const double search_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::cout << index << " " << gemm.name << ": " << heuristic_count << " candidates, " << near.size()
              << " near them (searched in " << search_seconds << " s)\n";
    for (const cublasLtMatmulAlgo_t& algo : near) candidates.add(algo);
    const int near_from = candidates.count() - static_cast<int>(near.size());

    std::vector<cuda::GemmLaunch> launches{bench.step_call(candidates, gemm)};
    std::vector<std::string> names{"the step's"};
    for (int rank = 0; rank < heuristic_count; ++rank) {
      launches.push_back(bench.candidate(candidates, gemm, rank));
      names.push_back("#" + std::to_string(rank) + " " + candidates.config(rank));
    }
    for (int rank = near_from; rank < candidates.count(); ++rank) {
      launches.push_back(bench.candidate(candidates, gemm, rank));
      names.push_back("near: " + candidates.config(rank));
    }
    const gemm_search::SustainedChoice all = gemm_search::choose_sustained(stream, launches);
    int best_heuristic = 0, best_other = -1;
    for (int at = 0; at < static_cast<int>(launches.size()); ++at) {
      std::cout << "  " << all.ms[at] << " ms  " << names[at] << "\n";
      if (all.ms[at] < 0.0) continue;
      int& best = at <= heuristic_count ? best_heuristic : best_other;
      if (best < 0 || all.ms[at] < all.ms[best]) best = at;
    }
    if (best_other < 0) best_other = best_heuristic;
    const gemm_search::SustainedChoice pair =
        gemm_search::choose_sustained(stream, {launches[best_heuristic], launches[best_other]});
    const double gain = 100.0 * (1.0 - pair.ms[1] / pair.ms[0]);
    std::cout << "  again: " << names[best_heuristic] << " " << pair.ms[0] << " ms; " << names[best_other]
              << " " << pair.ms[1] << " ms (" << gain << " % less" << (pair.kept == 1 ? ", kept" : "")
              << ")\n";
    heuristic_ms += gemm.calls_per_step * pair.ms[0];
    best_ms += gemm.calls_per_step * pair.ms[pair.kept];
  }
  std::cout << "a step's GEMMs under sustained load: " << heuristic_ms << " ms with the heuristic's best, "
            << best_ms << " ms with the others kept (" << 100.0 * (1.0 - best_ms / heuristic_ms) << " % less)\n";
}

}  // namespace
}  // namespace scalestudy::gpu_test
