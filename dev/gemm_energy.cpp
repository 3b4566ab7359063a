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
#include <cstdint>
#include <iomanip>
#include <iostream>
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

TEST(StepGemmEnergy, Gpt2SmallBatch64) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no GPU";
  constexpr int kCandidates = 8;
  constexpr size_t kLargestElems = size_t{42690} * 50304, kWorkspaceBytes = size_t{32} << 20;
  void* a = random_bf16(size_t{65536} * 3072, 1);
  void* b = random_bf16(kLargestElems, 2);
  void* c = random_bf16(kLargestElems, 3);
  void* aux = random_bf16(size_t{65536} * 3072, 4);
  void* bias = random_bf16(3072, 5);
  void *c_fp32 = nullptr, *workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&c_fp32, size_t{50304} * 768 * sizeof(float)));
  CHECK_CUDA(cudaMemset(c_fp32, 0, size_t{50304} * 768 * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&workspace, kWorkspaceBytes));
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t blas = nullptr;
  CHECK_CUBLAS(cublasCreate(&blas));
  CHECK_CUBLAS(cublasSetStream(blas, stream));
  cublasLtHandle_t lt = nullptr;
  CHECK_CUBLAS(cublasLtCreate(&lt));

  double step_mj = 0.0, saved_mj = 0.0;

  std::cout << std::fixed << std::setprecision(3);
  for (const StepGemm& gemm : step_gemms(bias, aux)) {
    const LtGemmShape& shape = gemm.shape;
    void* out = shape.c_type == CUDA_R_32F ? c_fp32 : c;
    const LtCandidates candidates(lt, shape, kWorkspaceBytes, kCandidates);
    const auto candidate = [&](int rank) {
      return [&, rank] { candidates.run(rank, a, b, gemm.beta, out, workspace, kWorkspaceBytes, stream); };
    };
    const std::function<void()> step_call =
        gemm.step_uses_lt ? std::function<void()>(candidate(0)) : [&] {
          const float alpha = 1.0f;
          CHECK_CUBLAS(cublasGemmEx(blas, shape.op_a, shape.op_b, shape.m, shape.n, shape.k, &alpha, a,
                                    shape.ab_type, shape.lda, b, shape.ab_type, shape.ldb, &gemm.beta, out,
                                    shape.c_type, shape.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
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
  CHECK_CUBLAS(cublasLtDestroy(lt));
  CHECK_CUBLAS(cublasDestroy(blas));
  CHECK_CUDA(cudaStreamDestroy(stream));
  for (void* buffer : {a, b, c, aux, bias, c_fp32, workspace}) CHECK_CUDA(cudaFree(buffer));
}

}  // namespace
}  // namespace scalestudy::gpu_test
