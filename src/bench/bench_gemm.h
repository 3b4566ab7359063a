#pragma once
// `scalestudy bench gemm`: TFLOP/s of square n×n×n matrix products, C = A·B, per
// precision. On cuda, cublasGemmEx directly: fp32 (CUBLAS_COMPUTE_32F), tf32
// (CUBLAS_COMPUTE_32F_FAST_TF32, fp32 storage), fp16 and bf16 (16-bit A, B and C,
// fp32 accumulation). On the cpu, the reference backend's matmul_forward in fp32; the
// other precisions are points marked unavailable, never dropped.
#include <string>
#include <vector>

#include "bench/bench_common.h"

namespace scalestudy {

inline const std::vector<std::string> kGemmPrecisions = {"fp32", "tf32", "fp16", "bf16"};

// Bytes of one element of A, B and C in a precision.
double gemm_element_bytes(const std::string& precision);

void run_gemm_bench(BenchContext& context);

}  // namespace scalestudy
