#include "dense_gelu.cuh"

#include <initializer_list>

#include "common.cuh"
#include "gemm.cuh"
#include "gemm_lt.cuh"
#include "matmul.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// The shape (every size positive) and the named operands (none null) of a launch.
void check_call(int rows, int in_channels, int out_channels,
                std::initializer_list<NamedOperand> operands) {
  check_positive(rows, "dense gelu rows");
  check_positive(in_channels, "dense gelu in_channels");
  check_positive(out_channels, "dense gelu out_channels");
  check_not_null(operands);
}

}  // namespace

template <class T>
bool launch_dense_gelu_forward(EpilogueGemm& epilogue_gemm, cudaStream_t stream,
                               const DenseGeluForwardArgs<T>& args) {
  const auto& [pre, out, inp, weight, bias, rows, in_channels, out_channels] = args;
  // pre may be null: a forward that no backward follows keeps no GELU input.
  check_call(rows, in_channels, out_channels,
             {{out, "dense gelu out"}, {inp, "dense gelu inp"}, {weight, "dense gelu weight"},
              {bias, "dense gelu bias"}});
  return epilogue_gemm.gelu_forward(stream, GemmTypesOf<T>::same.ab,
                                    {pre, out, inp, weight, bias, rows, in_channels, out_channels});
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
  check_call(rows, in_channels, out_channels,
             {{dpre, "dense gelu dpre"}, {dout, "dense gelu dout"}, {act, "dense gelu act"},
              {pre, "dense gelu pre"}, {weight, "dense gelu weight"}});
  const DenseGeluBackwardArgs<void> untyped{dpre, dweight, dbias, dout, act, pre, weight,
                                            rows, in_channels, out_channels, dact_scratch};
  if (!epilogue_gemm.gelu_input_gradient(stream, GemmTypesOf<T>::same.ab, untyped)) return false;
  // The dense layer's parameter gradients, of act = gelu(pre); no dinp, no weight.
  const MatmulBackwardArgs<T> parameter_gradients{nullptr, dweight, dbias, dout,        act,
                                                  nullptr, rows,    in_channels, out_channels};
  launch_matmul_parameter_gradients(handle, stream, parameter_gradients, scratch);
  return true;
}

#define SCALESTUDY_DENSE_GELU_INSTANCES(T)                                                        \
  template bool launch_dense_gelu_forward(EpilogueGemm&, cudaStream_t,                            \
                                          const DenseGeluForwardArgs<T>&);                        \
  template bool launch_dense_backward_through_gelu(EpilogueGemm&, cublasHandle_t, cudaStream_t,   \
                                                   const DenseGeluBackwardArgs<T>&, Scratch);
SCALESTUDY_FOR_EACH_16BIT_STORAGE(SCALESTUDY_DENSE_GELU_INSTANCES)
#undef SCALESTUDY_DENSE_GELU_INSTANCES

}  // namespace scalestudy::cuda
