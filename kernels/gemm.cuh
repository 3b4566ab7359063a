#pragma once
// cuBLAS GEMM wrappers shared by the matmul and attention launchers: fp32, and bf16 or
// fp16 operands with fp32 accumulation and a result in the operands' type or fp32.
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
// With bf16 or fp16 operands the same compute type runs on the tensor cores: the
// products of 16-bit values (8 or 11 significant bits) are exact in fp32 and accumulate
// in fp32; the result is rounded once to its storage type (including alpha*AB + beta*C
// when beta = 1 accumulates into C). In fp16 a result beyond 65504 rounds to +-inf.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"

namespace scalestudy::cuda {

// The storage of one GEMM's operands: A and B share a type (cublasGemmEx needs that),
// C may be wider.
struct GemmTypes {
  cudaDataType_t ab;
  cudaDataType_t c;
};

// The storage of the GEMMs over operands of type T: `same` keeps the result in T (the
// forwards, the input gradients); `to_fp32` writes it in fp32 (the weight gradients into
// the fp32 gradient buffer, the attention's scores).
template <class T>
struct GemmTypesOf;
template <>
struct GemmTypesOf<float> {
  static constexpr GemmTypes same{CUDA_R_32F, CUDA_R_32F};
  static constexpr GemmTypes to_fp32 = same;
};
template <>
struct GemmTypesOf<__nv_bfloat16> {
  static constexpr GemmTypes same{CUDA_R_16BF, CUDA_R_16BF};
  static constexpr GemmTypes to_fp32{CUDA_R_16BF, CUDA_R_32F};
};
template <>
struct GemmTypesOf<__half> {
  static constexpr GemmTypes same{CUDA_R_16F, CUDA_R_16F};
  static constexpr GemmTypes to_fp32{CUDA_R_16F, CUDA_R_32F};
};

// One matrix of a GEMM as cuBLAS sees it (column-major): its data, its leading dimension
// and, in a strided-batched GEMM, the elements from one batch entry's matrix to the next.
struct GemmMatrix {
  const void* data = nullptr;
  int ld = 0;
  long long batch_stride = 0;
};
struct GemmOutput {
  void* data = nullptr;
  int ld = 0;
  long long batch_stride = 0;
};

// c[m, n] = alpha * op_a(a) · op_b(b) + beta * c, with k the inner dimension; beta = 0
// never reads c. batch_count matters to gemm_strided_batched only.
struct GemmArgs {
  GemmTypes types{};
  cublasOperation_t op_a = CUBLAS_OP_N;
  cublasOperation_t op_b = CUBLAS_OP_N;
  int m = 0;
  int n = 0;
  int k = 0;
  float alpha = 1.0f;
  GemmMatrix a;
  GemmMatrix b;
  float beta = 0.0f;
  GemmOutput c;
  int batch_count = 1;
};

// cuBLAS's own algorithm for g, and its status.
inline cublasStatus_t cublas_gemm(cublasHandle_t handle, const GemmArgs& g) {
  return cublasGemmEx(handle, g.op_a, g.op_b, g.m, g.n, g.k, &g.alpha, g.a.data, g.types.ab, g.a.ld,
                      g.b.data, g.types.ab, g.b.ld, &g.beta, g.c.data, g.types.c, g.c.ld,
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

inline void gemm(cublasHandle_t handle, const GemmArgs& g) { CHECK_CUBLAS(cublas_gemm(handle, g)); }

inline void gemm_strided_batched(cublasHandle_t handle, const GemmArgs& g) {
  CHECK_CUBLAS(cublasGemmStridedBatchedEx(handle, g.op_a, g.op_b, g.m, g.n, g.k, &g.alpha, g.a.data,
                                          g.types.ab, g.a.ld, g.a.batch_stride, g.b.data,
                                          g.types.ab, g.b.ld, g.b.batch_stride, &g.beta, g.c.data,
                                          g.types.c, g.c.ld, g.c.batch_stride, g.batch_count,
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
