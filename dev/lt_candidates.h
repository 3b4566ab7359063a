#pragma once
// The algorithms cuBLASLt's heuristic offers for one GEMM (cuda::lt_candidates, with the
// step's preferences), and any added to them, each runnable by its rank, for the timing
// programs of dev/. The GEMM is c[m, n] = op_a(a) · op_b(b) + beta · c in cuBLAS's column-major terms
// (kernels/gemm.cuh), with fp32 accumulation and, optionally, one of cuBLASLt's epilogues.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "gemm_choice_file.cuh"
#include "sustained_search.h"

namespace scalestudy::gpu_test {

struct LtGemmShape {
  cublasOperation_t op_a = CUBLAS_OP_N;
  cublasOperation_t op_b = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  int lda = 0, ldb = 0, ldc = 0;
  cudaDataType_t ab_type = CUDA_R_16BF;
  cudaDataType_t c_type = CUDA_R_16BF;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // for the epilogues with a bias (or its gradient)
  void* aux = nullptr;         // for the GELU epilogues' pre-activation, ld m
  int multiprocessor_target = 0;  // cuBLASLt's SM count target; 0: the whole device
};

class LtCandidates {
 public:
  LtCandidates(cublasLtHandle_t handle, const LtGemmShape& shape, size_t workspace_bytes,
               int max_candidates)
      : handle_(handle), ab_type_(shape.ab_type), c_type_(shape.c_type) {
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set(CUBLASLT_MATMUL_DESC_TRANSA, shape.op_a);
    set(CUBLASLT_MATMUL_DESC_TRANSB, shape.op_b);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, shape.epilogue);
    if (shape.multiprocessor_target > 0)
      set(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, shape.multiprocessor_target);
    if (shape.bias != nullptr) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, shape.bias);
    if (shape.aux != nullptr) {
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{shape.m});
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, shape.aux);
    }
    const bool a_stored_m_by_k = shape.op_a == CUBLAS_OP_N;
    const bool b_stored_k_by_n = shape.op_b == CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a_layout_, shape.ab_type, a_stored_m_by_k ? shape.m : shape.k,
                                            a_stored_m_by_k ? shape.k : shape.m, shape.lda));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b_layout_, shape.ab_type, b_stored_k_by_n ? shape.k : shape.n,
                                            b_stored_k_by_n ? shape.n : shape.k, shape.ldb));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&c_layout_, shape.c_type, shape.m, shape.n, shape.ldc));
    algos_ = cuda::lt_candidates(problem(workspace_bytes), max_candidates);
  }
  ~LtCandidates() {
    for (cublasLtMatrixLayout_t layout : {a_layout_, b_layout_, c_layout_})
      CHECK_CUBLAS(cublasLtMatrixLayoutDestroy(layout));
    CHECK_CUBLAS(cublasLtMatmulDescDestroy(desc_));
  }
  LtCandidates(const LtCandidates&) = delete;
  LtCandidates& operator=(const LtCandidates&) = delete;

  int count() const { return static_cast<int>(algos_.size()); }

  // The GEMM as kernels/gemm_choice_file.cuh takes it.
  cuda::LtProblem problem(size_t workspace_bytes) const {
    return {handle_, desc_, a_layout_, b_layout_, c_layout_, ab_type_, c_type_, workspace_bytes};
  }

  // Appends an algorithm, runnable then by its rank.
  void add(const cublasLtMatmulAlgo_t& algo) { algos_.push_back(algo); }
  const std::vector<cublasLtMatmulAlgo_t>& algorithms() const { return algos_; }

  // c = a · b (+ beta · c) through the candidate of this rank, on `stream`.
  void run(int rank, const void* a, const void* b, float beta, void* c, void* workspace,
           size_t workspace_bytes, cudaStream_t stream) const {
    CHECK_CUBLAS(launch(rank, a, b, beta, c, workspace, workspace_bytes, stream));
  }
  // The same, returning cuBLAS's status: an algorithm may still be refused at launch.
  cublasStatus_t launch(int rank, const void* a, const void* b, float beta, void* c, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream) const {
    return launch(algos_[rank], a, b, beta, c, workspace, workspace_bytes, stream);
  }
  // The same through any algorithm for this GEMM.
  cublasStatus_t launch(const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, float beta, void* c,
                        void* workspace, size_t workspace_bytes, cudaStream_t stream) const {
    const float alpha = 1.0f;
    return cublasLtMatmul(handle_, desc_, &alpha, a, a_layout_, b, b_layout_, &beta, c, c_layout_, c, c_layout_,
                          &algo, workspace, workspace_bytes, stream);
  }

  // "lt id=... tile=... stages=... ...", as --gemm-algos-file keeps it.
  std::string config(int rank) const { return cuda::lt_algorithm_config(algos_[rank]); }

 private:
  template <class Value>
  void set(cublasLtMatmulDescAttributes_t attribute, const Value& value) {
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, attribute, &value, sizeof(value)));
  }

  cublasLtHandle_t handle_;
  cudaDataType_t ab_type_, c_type_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, c_layout_ = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos_;
};

}  // namespace scalestudy::gpu_test
