#include "gemm_lt.cuh"

#include <cstdint>

#include "common.cuh"
#include "core/check.h"

namespace scalestudy::cuda {
namespace {

constexpr uintptr_t kOperandAlignment = 16;
// 16-bit columns of a multiple of 8 elements keep every column 16-byte aligned.
constexpr int kAlignedColumns = 8;
constexpr long long kMaxOperandElems = (1LL << 31) - 1;

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kOperandAlignment == 0; }

template <class Value>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const Value& value) {
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

// Leading dimensions a multiple of 8 and no operand of 2^31 elements or more.
bool shape_allowed(int m, int n, int k) {
  const auto elems = [](int rows, int columns) { return static_cast<long long>(rows) * columns; };
  return m % kAlignedColumns == 0 && k % kAlignedColumns == 0 && elems(m, n) <= kMaxOperandElems &&
         elems(k, n) <= kMaxOperandElems && elems(m, k) <= kMaxOperandElems;
}

}  // namespace

EpilogueGemm::EpilogueGemm() {
  CHECK_CUBLAS(cublasLtCreate(&handle_));
  CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
}

EpilogueGemm::~EpilogueGemm() {
  for (Plan& plan : plans_) {
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.a_layout));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.b_layout));
    CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(plan.d_layout));
    CHECK_CUBLAS(cublasLtMatmulDescDestroy(plan.desc));
  }
  CHECK_CUDA(cudaFree(workspace_));
  CHECK_CUBLAS(cublasLtDestroy(handle_));
}

// Column-major, as gemm.cuh explains. The forwards compute out^T[OC, N] = W[OC, IC] ·
// inp^T[IC, N]: A is the row-major [OC, IC] weight seen as [IC, OC] (op T), and the bias
// runs along OC, the rows of out^T, which is what the epilogue broadcasts. The input
// gradient computes dpre^T[IC, N] = W^T[IC, OC] · dout^T[OC, N]: A is the weight as is (op
// N). The auxiliary matrix (pre^T) has D's shape and leading dimension. Split-K may reduce
// in fp32 only (the compute type), never in the 16-bit output type.
EpilogueGemm::Plan* EpilogueGemm::plan_for(Epilogue epilogue, cudaDataType_t type, int m, int n,
                                           int k) {
  for (Plan& plan : plans_)
    if (plan.epilogue == epilogue && plan.type == type && plan.m == m && plan.n == n &&
        plan.k == k && plan.multiprocessor_target == multiprocessor_target_)
      return plan.usable ? &plan : nullptr;
  Plan plan{epilogue, type, m, n, k, multiprocessor_target_};
  const bool transposed_a = epilogue != Epilogue::dgelu;
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_BIAS;
  if (epilogue == Epilogue::gelu_aux_bias) kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  if (epilogue == Epilogue::dgelu) kind = CUBLASLT_EPILOGUE_DGELU;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                cublasOperation_t{transposed_a ? CUBLAS_OP_T : CUBLAS_OP_N});
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t{CUBLAS_OP_N});
  set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, kind);
  if (epilogue != Epilogue::bias)
    set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{m});
  if (multiprocessor_target_ > 0)
    set_attribute(plan.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t{multiprocessor_target_});
  if (transposed_a)
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.a_layout, type, k, m, k));
  else
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.a_layout, type, m, k, m));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.b_layout, type, k, n, k));
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.d_layout, type, m, n, m));

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
  // not a failure: the caller falls back to the unfused kernels, and the GPU tests
  // BiasEpilogueTakesTheGpt2Shapes and GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu say
  // so where it happens.
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan.desc, plan.a_layout, plan.b_layout, plan.d_layout, plan.d_layout, preference,
      1, &result, &found);
  CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(preference));
  plan.usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
  plan.algo = result.algo;
  plans_.push_back(plan);
  return plans_.back().usable ? &plans_.back() : nullptr;
}

EpilogueGemm::Plan* EpilogueGemm::aligned_plan_for(Epilogue epilogue, cudaDataType_t type, int m,
                                                   int n, int k,
                                                   std::initializer_list<const void*> operands) {
  for (const void* operand : operands)
    if (!aligned(operand)) return nullptr;
  return shape_allowed(m, n, k) ? plan_for(epilogue, type, m, n, k) : nullptr;
}

// beta = 0, so D is only written: it is passed as C too, which cuBLASLt then never reads.
void EpilogueGemm::run(Plan& plan, cudaStream_t stream, const void* a, const void* b, void* d) {
  const float alpha = 1.0f, beta = 0.0f;
  CHECK_CUBLAS(cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a_layout, b, plan.b_layout,
                              &beta, d, plan.d_layout, d, plan.d_layout, &plan.algo, workspace_,
                              kWorkspaceBytes, stream));
}

bool EpilogueGemm::forward(cudaStream_t stream, cudaDataType_t type, void* out, const void* inp,
                           const void* weight, const void* bias, int rows, int in_channels,
                           int out_channels) {
  Plan* plan = aligned_plan_for(Epilogue::bias, type, out_channels, rows, in_channels,
                                {out, inp, weight, bias});
  if (plan == nullptr) return false;
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  run(*plan, stream, weight, inp, out);
  return true;
}

bool EpilogueGemm::gelu_forward(cudaStream_t stream, cudaDataType_t type, void* pre, void* out,
                                const void* inp, const void* weight, const void* bias, int rows,
                                int in_channels, int out_channels) {
  Plan* plan = aligned_plan_for(Epilogue::gelu_aux_bias, type, out_channels, rows, in_channels,
                                {pre, out, inp, weight, bias});
  if (plan == nullptr) return false;
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, pre);
  run(*plan, stream, weight, inp, out);
  return true;
}

bool EpilogueGemm::gelu_input_gradient(cudaStream_t stream, cudaDataType_t type, void* dpre,
                                       const void* dout, const void* weight, const void* pre,
                                       int rows, int in_channels, int out_channels) {
  Plan* plan = aligned_plan_for(Epilogue::dgelu, type, in_channels, rows, out_channels,
                                {dpre, dout, weight, pre});
  if (plan == nullptr) return false;
  set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, pre);
  run(*plan, stream, weight, dout, dpre);
  return true;
}

}  // namespace scalestudy::cuda
