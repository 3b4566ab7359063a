#include "gemm_lt.cuh"

#include <cstdint>

#include "common.cuh"
#include "core/check.h"

namespace scalestudy::cuda {
namespace {

constexpr uintptr_t kOperandAlignment = 16;

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kOperandAlignment == 0; }

template <class Value>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const Value& value) {
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

}  // namespace

BiasGemm::BiasGemm() {
  CHECK_CUBLAS(cublasLtCreate(&handle_));
  CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
}

BiasGemm::~BiasGemm() {
  for (Plan& plan : plans_) {
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.weight_layout));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.inp_layout));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.out_layout));
    CHECK_CUBLAS(cublasLtMatmulDescDestroy(plan.desc));
  }
  CHECK_CUDA(cudaFree(workspace_));
  CHECK_CUBLAS(cublasLtDestroy(handle_));
}

// Column-major, as gemm.cuh explains: out^T[OC, N] = W[OC, IC] · inp^T[IC, N], W being
// the row-major [OC, IC] weight seen as [IC, OC] (op T). The bias runs along OC, the rows
// of out^T, which is what the epilogue broadcasts. Split-K may reduce in fp32 only (the
// compute type), never in the 16-bit output type.
BiasGemm::Plan& BiasGemm::plan_for(cudaDataType_t type, int rows, int in_channels,
                                   int out_channels) {
  for (Plan& plan : plans_)
    if (plan.type == type && plan.rows == rows && plan.in_channels == in_channels &&
        plan.out_channels == out_channels)
      return plan;
  Plan plan{type, rows, in_channels, out_channels};
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t{CUBLAS_OP_T});
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t{CUBLAS_OP_N});
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t{CUBLASLT_EPILOGUE_BIAS});
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.weight_layout, type, in_channels, out_channels,
                                          in_channels));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.inp_layout, type, in_channels, rows, in_channels));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.out_layout, type, out_channels, rows, out_channels));

  cublasLtMatmulPreference_t preference = nullptr;
  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  const uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const uint32_t alignment = kOperandAlignment;
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)));
  CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_mask, sizeof(reduction_mask)));
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment,
                                                      sizeof(alignment)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // A refusal (no algorithm, or a configuration this cuBLASLt does not take) is an answer,
  // not a failure: the caller falls back to the GEMM and the bias kernel, and the GPU test
  // BiasEpilogueTakesTheGpt2Shapes says so where it happens.
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan.desc, plan.weight_layout, plan.inp_layout, plan.out_layout, plan.out_layout,
      preference, 1, &result, &found);
  CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(preference));
  plan.usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
  plan.algo = result.algo;
  plans_.push_back(plan);
  return plans_.back();
}

bool BiasGemm::forward(cudaStream_t stream, cudaDataType_t type, void* out, const void* inp,
                       const void* weight, const void* bias, int rows, int in_channels,
                       int out_channels) {
  if (!aligned(out) || !aligned(inp) || !aligned(weight) || !aligned(bias) ||
      in_channels % 8 != 0 || out_channels % 8 != 0)
    return false;
  Plan& plan = plan_for(type, rows, in_channels, out_channels);
  if (!plan.usable) return false;
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f, beta = 0.0f;
  CHECK_CUBLAS(cublasLtMatmul(handle_, plan.desc, &alpha, weight, plan.weight_layout, inp,
                              plan.inp_layout, &beta, out, plan.out_layout, out, plan.out_layout,
                              &plan.algo, workspace_, kWorkspaceBytes, stream));
  return true;
}

}  // namespace scalestudy::cuda
