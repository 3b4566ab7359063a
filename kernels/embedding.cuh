#pragma once
// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. out and the tables
// it reads are fp32, bf16 or fp16 storage alike (16-bit tables being the backend's copy of
// the fp32 parameters); the backward's dout is out's storage, and the gradients are fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "op_params.h"
#include "scratch.cuh"

namespace scalestudy::cuda {

// A negative token id makes its output row NaN (the id cannot be checked on the host
// without a synchronisation); ids at or above the vocabulary are the data layer's to
// reject, since the vocabulary is not part of this op. T is float, __nv_bfloat16 or
// __half, here and below.
template <class T>
void launch_embedding_forward(cudaStream_t stream, const EmbeddingForwardArgs<T>& args);
// dwte[tokens[n],:] += dout[n,:] and dwpe[t,:] += dout[b,t,:], deterministically: every
// gradient row is summed in increasing row order, the CPU backend's order, so the
// results are bit-identical to it (given the same dout values). Rows with a negative
// token add nothing to dwte. The token ids are sorted in scratch, of at least
// embedding_backward_scratch_elems floats.
size_t embedding_backward_scratch_elems(int batch, int seq);
template <class T>
void launch_embedding_backward(cudaStream_t stream, const EmbeddingBackwardArgs<T>& args,
                               Scratch scratch);

}  // namespace scalestudy::cuda
