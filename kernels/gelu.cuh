#pragma once
// GELU with the tanh approximation that GPT-2 was trained with, run two ways: by
// elementwise kernels, and inside the GEMMs of the MLP's dense layers around it.
//
// The elementwise kernels take fp32, bf16 or fp16 storage (fp32 arithmetic either way).
//
// Inside the dense layers, in bf16 or fp16: the first layer's forward applies the GELU in
// its epilogue and keeps the GELU's input (pre) as the epilogue's auxiliary output; the
// second layer's input gradient applies the GELU's derivative in its epilogue, reading pre
// back. Neither the GELU's output nor the gradient of that output makes a round trip
// through memory of its own, and no GELU kernel runs. The weight and the bias are the
// parameters' 16-bit copies; the weight and bias gradients are fp32. The fp16 launchers
// work, but the backend takes them in bf16 only: cuBLASLt's fp16 GELU missed the fp16
// rounding (CudaOps::gelu_epilogues_allowed). Each of these launchers returns false,
// having done nothing, where cuBLASLt declines the epilogue (gemm_lt.cuh): the caller then
// runs the dense layer and the elementwise GELU kernels one after the other. blas.handle
// must be bound to stream.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "op_params.h"
#include "scratch.cuh"

namespace scalestudy::cuda {

// ---- elementwise ----------------------------------------------------------------------
// T is float, __nv_bfloat16 or __half.
template <class T>
void launch_gelu_forward(cudaStream_t stream, T* out, const T* inp, size_t elems);
// dinp += gelu'(inp) * dout, or dinp = gelu'(inp) * dout without accumulate_dinp.
template <class T>
void launch_gelu_backward(cudaStream_t stream, T* dinp, const T* inp, const T* dout, size_t elems,
                          bool accumulate_dinp);

// ---- inside the dense layers' GEMMs ---------------------------------------------------
class LtGemm;
struct Blas;  // gemm_lt.cuh

// pre[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC], out = gelu(pre); both written. T is
// __nv_bfloat16 or __half, here and below.
template <class T>
bool launch_dense_gelu_forward(LtGemm& lt_gemm, cudaStream_t stream,
                               const DenseGeluForwardArgs<T>& args);

// Floats of scratch that launch_dense_backward_through_gelu needs (the bias reduction).
size_t dense_backward_through_gelu_scratch_elems(int rows, int out_channels);
// The backward of out[N,OC] = act[N,IC] @ weight[OC,IC]^T + bias with act = gelu(pre):
// dpre = gelu'(pre) * (dout @ weight) written (its old contents never read); dweight +=
// dout^T @ act and dbias += column sums of dout (dbias may be null) accumulated.
// dact_scratch is not used.
template <class T>
bool launch_dense_backward_through_gelu(LtGemm& lt_gemm, const Blas& blas,
                                        cudaStream_t stream, const DenseGeluBackwardArgs<T>& args,
                                        Scratch scratch);

}  // namespace scalestudy::cuda
