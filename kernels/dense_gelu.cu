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

}  // namespace

template <class T>
bool launch_dense_gelu_forward(EpilogueGemm& epilogue_gemm, cudaStream_t stream,
                               const DenseGeluForwardArgs<T>& args) {
  const auto& [pre, out, inp, weight, bias, rows, in_channels, out_channels] = args;
  check_shape(rows, in_channels, out_channels);
  // pre may be null: a forward that no backward follows keeps no GELU input.
  check_not_null({{out, "dense gelu out"}, {inp, "dense gelu inp"}, {weight, "dense gelu weight"}, {bias, "dense gelu bias"}});
  return epilogue_gemm.gelu_forward(stream, {data_type_of<T>(), out, inp, weight, bias, rows,
                                             in_channels, out_channels, pre});
}

size_t dense_backward_through_gelu_scratch_elems(int rows, int out_channels) {
  return matmul_backward_scratch_elems(rows, out_channels);
}

// The input gradient's GEMM goes first: where its epilogue is declined nothing has been
// written, and the caller's unfused backward computes the parameter gradients itself.
template <class T>
bool launch_dense_backward_through_gelu(EpilogueGemm& epilogue_gemm, cublasHandle_t handle,
                                        cudaStream_t stream, const DenseGeluBackwardArgs<T>& args,
                                        Scratch scratch) {
  const auto& [dpre, dweight, dbias, dout, act, pre, weight, rows, in_channels, out_channels,
               dact_scratch] = args;
  check_shape(rows, in_channels, out_channels);
  check_not_null({{dpre, "dense gelu dpre"},
                  {dout, "dense gelu dout"},
                  {act, "dense gelu act"},
                  {pre, "dense gelu pre"},
                  {weight, "dense gelu weight"}});
  if (!epilogue_gemm.gelu_input_gradient(stream, {data_type_of<T>(), dpre, dout, weight, pre, rows,
                                                  in_channels, out_channels}))
    return false;
  launch_matmul_parameter_gradients(
      handle, stream,
      MatmulParameterGradientArgs<T>{dweight, dbias, dout, act, rows, in_channels, out_channels},
      scratch);
  return true;
}

#define SCALESTUDY_DENSE_GELU_INSTANCES(T)                                                        \
  template bool launch_dense_gelu_forward(EpilogueGemm&, cudaStream_t,                            \
                                          const DenseGeluForwardArgs<T>&);                        \
  template bool launch_dense_backward_through_gelu(EpilogueGemm&, cublasHandle_t, cudaStream_t,   \
                                                   const DenseGeluBackwardArgs<T>&, Scratch);
SCALESTUDY_DENSE_GELU_INSTANCES(bf16)
SCALESTUDY_DENSE_GELU_INSTANCES(fp16)
#undef SCALESTUDY_DENSE_GELU_INSTANCES

}  // namespace scalestudy::cuda
