#include "dense_gelu.cuh"

#include "common.cuh"
#include "gemm_lt.cuh"
#include "matmul.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

template <class T>
constexpr cudaDataType_t data_type_of();
template <>
constexpr cudaDataType_t data_type_of<bf16>() { return CUDA_R_16BF; }
template <>
constexpr cudaDataType_t data_type_of<fp16>() { return CUDA_R_16F; }

void check_shape(int rows, int in_channels, int out_channels) {
  check_positive(rows, "dense gelu rows");
  check_positive(in_channels, "dense gelu in_channels");
  check_positive(out_channels, "dense gelu out_channels");
}

template <class T>
bool dense_gelu_forward(EpilogueGemm& epilogue_gemm, cudaStream_t stream, T* pre, T* out,
                        const T* inp, const T* weight, const T* bias, int rows, int in_channels,
                        int out_channels) {
  check_shape(rows, in_channels, out_channels);
  check_not_null(pre, "dense gelu pre");
  check_not_null(out, "dense gelu out");
  check_not_null(inp, "dense gelu inp");
  check_not_null(weight, "dense gelu weight");
  check_not_null(bias, "dense gelu bias");
  return epilogue_gemm.gelu_forward(stream, data_type_of<T>(), pre, out, inp, weight, bias, rows,
                                    in_channels, out_channels);
}

// The input gradient's GEMM goes first: where its epilogue is declined nothing has been
// written, and the caller's unfused backward computes the parameter gradients itself.
template <class T>
bool dense_backward_through_gelu(EpilogueGemm& epilogue_gemm, cublasHandle_t handle,
                                 cudaStream_t stream, T* dpre, float* dweight, float* dbias,
                                 const T* dout, const T* act, const T* pre, const T* weight,
                                 int rows, int in_channels, int out_channels, float* scratch,
                                 size_t scratch_elems) {
  check_shape(rows, in_channels, out_channels);
  check_not_null(dpre, "dense gelu dpre");
  check_not_null(dout, "dense gelu dout");
  check_not_null(act, "dense gelu act");
  check_not_null(pre, "dense gelu pre");
  check_not_null(weight, "dense gelu weight");
  if (!epilogue_gemm.gelu_input_gradient(stream, data_type_of<T>(), dpre, dout, weight, pre, rows,
                                         in_channels, out_channels))
    return false;
  launch_matmul_parameter_gradients(handle, stream, dweight, dbias, dout, act, rows, in_channels,
                                    out_channels, scratch, scratch_elems);
  return true;
}

}  // namespace

bool launch_dense_gelu_forward(EpilogueGemm& epilogue_gemm, cudaStream_t stream, bf16* pre,
                               bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                               int rows, int in_channels, int out_channels) {
  return dense_gelu_forward(epilogue_gemm, stream, pre, out, inp, weight, bias, rows, in_channels,
                            out_channels);
}

bool launch_dense_gelu_forward(EpilogueGemm& epilogue_gemm, cudaStream_t stream, fp16* pre,
                               fp16* out, const fp16* inp, const fp16* weight, const fp16* bias,
                               int rows, int in_channels, int out_channels) {
  return dense_gelu_forward(epilogue_gemm, stream, pre, out, inp, weight, bias, rows, in_channels,
                            out_channels);
}

size_t dense_backward_through_gelu_scratch_elems(int rows, int out_channels) {
  return matmul_backward_scratch_elems(rows, out_channels);
}

bool launch_dense_backward_through_gelu(EpilogueGemm& epilogue_gemm, cublasHandle_t handle,
                                        cudaStream_t stream, bf16* dpre, float* dweight,
                                        float* dbias, const bf16* dout, const bf16* act,
                                        const bf16* pre, const bf16* weight, int rows,
                                        int in_channels, int out_channels, float* scratch,
                                        size_t scratch_elems) {
  return dense_backward_through_gelu(epilogue_gemm, handle, stream, dpre, dweight, dbias, dout,
                                     act, pre, weight, rows, in_channels, out_channels, scratch,
                                     scratch_elems);
}

bool launch_dense_backward_through_gelu(EpilogueGemm& epilogue_gemm, cublasHandle_t handle,
                                        cudaStream_t stream, fp16* dpre, float* dweight,
                                        float* dbias, const fp16* dout, const fp16* act,
                                        const fp16* pre, const fp16* weight, int rows,
                                        int in_channels, int out_channels, float* scratch,
                                        size_t scratch_elems) {
  return dense_backward_through_gelu(epilogue_gemm, handle, stream, dpre, dweight, dbias, dout,
                                     act, pre, weight, rows, in_channels, out_channels, scratch,
                                     scratch_elems);
}

}  // namespace scalestudy::cuda
