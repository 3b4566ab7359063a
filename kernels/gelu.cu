#include "gelu.cuh"

#include <initializer_list>

#include "common.cuh"
#include "op_params.h"
#include "gemm.cuh"
#include "gemm_lt.cuh"
#include "matmul.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {

// ---- elementwise ----------------------------------------------------------------------
namespace {

// kGeluScale and kGeluCubic (kernels/op_params.h) are the CPU reference's.
constexpr float kGeluCubicSlope = 3.0f * kGeluCubic;

// The __f*_rn intrinsics keep nvcc from fusing multiply-adds, so every step rounds as
// in the CPU reference; only tanhf itself (within 2 ulp of the CPU's) can differ.
__device__ inline float gelu_inner(float x) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCubic, x), x), x);
  return __fmul_rn(kGeluScale, __fadd_rn(x, cube));
}

__device__ inline float gelu(float x) {
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(gelu_inner(x))));
}

// gelu'(x) * dout, added to dinp where kAccumulate.
template <bool kAccumulate>
__device__ inline float gelu_backward(float dinp, float x, float dout) {
  const float tanh_inner = tanhf(gelu_inner(x));
  const float sech_squared = __fsub_rn(1.0f, __fmul_rn(tanh_inner, tanh_inner));
  const float dinner =
      __fmul_rn(kGeluScale, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kGeluCubicSlope, x), x)));
  const float local_grad =
      __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, tanh_inner)),
                __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), sech_squared), dinner));
  const float grad = __fmul_rn(local_grad, dout);
  return kAccumulate ? __fadd_rn(dinp, grad) : grad;
}

// No __restrict__: as on the CPU, an output may alias an input; each element (each
// 16-byte pack, where the pointers allow packs) is read and written by one thread.
template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t elems, size_t packs) {
  for_each_pack_then_element<T>(
      elems, packs,
      [&](size_t i) {
        const Pack<T> x = load_pack(inp + i);
        Pack<T> y;
#pragma unroll
        for (int k = 0; k < Pack<T>::kCount; ++k) y.set(k, gelu(x.get(k)));
        store_pack(out + i, y);
      },
      [&](size_t i) { out[i] = from_float<T>(gelu(to_float(inp[i]))); });
}

// Without kAccumulate dinp is only written: its old contents may be anything.
template <class T, bool kAccumulate>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t elems,
                                     size_t packs) {
  for_each_pack_then_element<T>(
      elems, packs,
      [&](size_t i) {
        Pack<T> grad{};
        if (kAccumulate) grad = load_pack(dinp + i);
        const Pack<T> x = load_pack(inp + i), dy = load_pack(dout + i);
#pragma unroll
        for (int k = 0; k < Pack<T>::kCount; ++k)
          grad.set(k, gelu_backward<kAccumulate>(grad.get(k), x.get(k), dy.get(k)));
        store_pack(dinp + i, grad);
      },
      [&](size_t i) {
        const float old = kAccumulate ? to_float(dinp[i]) : 0.0f;
        dinp[i] =
            from_float<T>(gelu_backward<kAccumulate>(old, to_float(inp[i]), to_float(dout[i])));
      });
}

}  // namespace

template <class T>
void launch_gelu_forward(cudaStream_t stream, T* out, const T* inp, size_t elems) {
  launch_packed<T>(stream, gelu_forward_kernel<T>, elems, {{out, "gelu out"}, {inp, "gelu inp"}},
                   out, inp);
}

template <class T>
void launch_gelu_backward(cudaStream_t stream, T* dinp, const T* inp, const T* dout, size_t elems,
                          bool accumulate_dinp) {
  const auto kernel =
      accumulate_dinp ? gelu_backward_kernel<T, true> : gelu_backward_kernel<T, false>;
  launch_packed<T>(stream, kernel, elems,
                   {{dinp, "gelu dinp"}, {inp, "gelu inp"}, {dout, "gelu dout"}}, dinp, inp, dout);
}

#define SCALESTUDY_GELU_INSTANCES(T)                                                               \
  template void launch_gelu_forward(cudaStream_t, T*, const T*, size_t);                           \
  template void launch_gelu_backward(cudaStream_t, T*, const T*, const T*, size_t, bool);
SCALESTUDY_FOR_EACH_STORAGE(SCALESTUDY_GELU_INSTANCES)
#undef SCALESTUDY_GELU_INSTANCES

// ---- inside the dense layers' GEMMs ---------------------------------------------------
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
bool launch_dense_gelu_forward(LtGemm& lt_gemm, cudaStream_t stream,
                               const DenseGeluForwardArgs<T>& args) {
  const auto& [pre, out, inp, weight, bias, rows, in_channels, out_channels, inp_stride,
               out_stride] = args;
  // pre may be null: a forward that no backward follows keeps no GELU input.
  check_call(rows, in_channels, out_channels,
             {{out, "dense gelu out"}, {inp, "dense gelu inp"}, {weight, "dense gelu weight"},
              {bias, "dense gelu bias"}});
  check_row_stride(inp_stride, in_channels, "dense gelu inp");
  check_row_stride(out_stride, out_channels, "dense gelu out");
  if (!lt_gemm.gelu_forward(stream, GemmTypesOf<T>::same.ab,
                            {pre, out, inp, weight, bias, rows, in_channels, out_channels, inp_stride,
                             out_stride}))
    return false;
  if (out_stride != 0) launch_augmented_columns(stream, out, rows, out_channels, out_stride);
  return true;
}

size_t dense_backward_through_gelu_scratch_elems(int rows, int out_channels) {
  return matmul_backward_scratch_elems(rows, out_channels);
}

// The input gradient's GEMM goes first: where its epilogue is declined nothing has been
// written, and the caller's unfused backward computes the parameter gradients itself.
template <class T>
bool launch_dense_backward_through_gelu(LtGemm& lt_gemm, const Blas& blas,
                                        cudaStream_t stream, const DenseGeluBackwardArgs<T>& args,
                                        Scratch scratch) {
  const auto& [dpre, dweight, dbias, dout, act, pre, weight, rows, in_channels, out_channels,
               dact_scratch, act_stride] = args;
  check_call(rows, in_channels, out_channels,
             {{dpre, "dense gelu dpre"}, {dout, "dense gelu dout"}, {act, "dense gelu act"},
              {pre, "dense gelu pre"}, {weight, "dense gelu weight"}});
  const DenseGeluBackwardArgs<void> untyped{dpre, dweight, dbias, dout, act, pre, weight,
                                            rows, in_channels, out_channels, dact_scratch};
  if (!lt_gemm.gelu_input_gradient(stream, GemmTypesOf<T>::same.ab, untyped)) return false;
  // The dense layer's parameter gradients, of act = gelu(pre); no dinp, no weight.
  const MatmulBackwardArgs<T> parameter_gradients{.dweight = dweight, .dbias = dbias, .dout = dout,
                                                  .inp = act, .rows = rows,
                                                  .in_channels = in_channels,
                                                  .out_channels = out_channels,
                                                  .inp_stride = act_stride};
  launch_matmul_parameter_gradients(blas, stream, parameter_gradients, scratch);
  return true;
}

#define SCALESTUDY_DENSE_GELU_INSTANCES(T)                                                         \
  template bool launch_dense_gelu_forward(LtGemm&, cudaStream_t,                             \
                                          const DenseGeluForwardArgs<T>&);                         \
  template bool launch_dense_backward_through_gelu(LtGemm&, const Blas&, cudaStream_t,       \
                                                   const DenseGeluBackwardArgs<T>&, Scratch);
SCALESTUDY_FOR_EACH_16BIT_STORAGE(SCALESTUDY_DENSE_GELU_INSTANCES)
#undef SCALESTUDY_DENSE_GELU_INSTANCES

}  // namespace scalestudy::cuda
