#pragma once
// LayerNorm over rows of C channels, eps 1e-5, with the CPU backend's arithmetic: row
// statistics in double, and per-element expressions rounded step by step as the CPU
// rounds them. The activations (inp, out, dout, dinp) and the parameters read (weight, bias)
// are fp32, bf16 or fp16 storage alike, the 16-bit parameters being the backend's copy of
// the fp32 ones; mean, rstd and the parameter gradients are fp32 either way.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "op_params.h"
#include "scratch.cuh"

namespace scalestudy::cuda {

// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * weight + bias; mean and rstd are kept for
// the backward.
// T is float, __nv_bfloat16 or __half, as for every launcher below.
template <class T>
void launch_layernorm_forward(cudaStream_t stream, const LayerNormForwardArgs<T>& args);

// Floats of scratch that launch_layernorm_backward needs for its column partials.
size_t layernorm_backward_scratch_elems(int rows, int channels);
// Accumulates (+=) into dweight and dbias, column sums over rows reduced deterministically
// in two stages through scratch. dinp is written as dinp_write says: accumulate, dinp +=
// the input gradient; overwrite, dinp = the input gradient, and dinp is never read, so it
// may hold anything (NaN included): the caller saves zeroing a buffer it is about to fill.
template <class T>
void launch_layernorm_backward(cudaStream_t stream, const LayerNormBackwardArgs<T>& args,
                               Scratch scratch);

}  // namespace scalestudy::cuda
