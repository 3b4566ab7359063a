#pragma once
// The dense layer's forward with its bias added in cuBLASLt's epilogue
// (CUBLASLT_EPILOGUE_BIAS): the bias costs no pass of its own over the output. cuBLASLt
// takes the bias in the output's type (an fp32 bias vector with a bf16 output was refused
// on an H200 with CUBLAS_STATUS_INVALID_VALUE), so the bias comes from the 16-bit copy
// of the parameters, like the weight; the output is rounded once, from the fp32
// accumulator plus that bias. Plans (descriptors, layouts and the algorithm) are made
// once per shape and kept.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace scalestudy::cuda {

class BiasGemm {
 public:
  // The cuBLASLt workspace this object allocates.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  BiasGemm();
  ~BiasGemm();
  BiasGemm(const BiasGemm&) = delete;
  BiasGemm& operator=(const BiasGemm&) = delete;

  // out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC], with out, inp, weight and bias of
  // `type` (CUDA_R_16BF or CUDA_R_16F). Returns false, having done nothing, where cuBLASLt
  // offers no algorithm or the operands are not 16-byte aligned: the caller then runs the
  // GEMM and the bias kernel.
  bool forward(cudaStream_t stream, cudaDataType_t type, void* out, const void* inp,
               const void* weight, const void* bias, int rows, int in_channels,
               int out_channels);

 private:
  struct Plan {
    cudaDataType_t type;
    int rows, in_channels, out_channels;
    bool usable = false;  // cuBLASLt had an algorithm for it
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t weight_layout = nullptr, inp_layout = nullptr, out_layout = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  Plan& plan_for(cudaDataType_t type, int rows, int in_channels, int out_channels);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::vector<Plan> plans_;
};

}  // namespace scalestudy::cuda
