#pragma once
// fp32 cuBLAS GEMM wrappers shared by the matmul and attention launchers.
//
// cuBLAS is column-major; every tensor here is row-major. A row-major [r, c] matrix with
// row stride ld is, to cuBLAS, the column-major [c, r] matrix (its transpose) with
// leading dimension ld. So a row-major product Y = A B is computed as the column-major
// Y^T = B^T A^T, and a row-major operand that the formula needs transposed is passed
// with CUBLAS_OP_N, one needed as is with CUBLAS_OP_T. Each call site writes out its
// mapping.
//
// CUBLAS_COMPUTE_32F, not the TF32 compute types: the CUDA backend is compared against
// the fp32 CPU reference, and TF32's 10-bit mantissa would dominate that comparison.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/check.h"

namespace scalestudy::cuda {

inline void gemm_fp32(cublasHandle_t handle, cublasOperation_t op_a, cublasOperation_t op_b,
                      int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  CHECK_CUBLAS(cublasGemmEx(handle, op_a, op_b, m, n, k, &alpha, a, CUDA_R_32F, lda, b,
                            CUDA_R_32F, ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

inline void gemm_fp32_strided_batched(cublasHandle_t handle, cublasOperation_t op_a,
                                      cublasOperation_t op_b, int m, int n, int k, float alpha,
                                      const float* a, int lda, long long stride_a,
                                      const float* b, int ldb, long long stride_b, float beta,
                                      float* c, int ldc, long long stride_c, int batch_count) {
  CHECK_CUBLAS(cublasGemmStridedBatchedEx(handle, op_a, op_b, m, n, k, &alpha, a, CUDA_R_32F,
                                          lda, stride_a, b, CUDA_R_32F, ldb, stride_b, &beta, c,
                                          CUDA_R_32F, ldc, stride_c, batch_count,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The launchers issue kernels on `stream` and GEMMs through `handle`; both must be the
// same stream or the two would race.
inline void check_handle_stream(cublasHandle_t handle, cudaStream_t stream) {
  SCALESTUDY_CHECK(handle != nullptr, "cuBLAS handle must not be null");
  cudaStream_t handle_stream = nullptr;
  CHECK_CUBLAS(cublasGetStream(handle, &handle_stream));
  SCALESTUDY_CHECK(handle_stream == stream,
                   "the cuBLAS handle must be bound to the stream the launcher is given");
}

}  // namespace scalestudy::cuda
