#pragma once
// Token + position embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. out and the tables
// it reads are fp32, bf16 or fp16 storage alike (16-bit tables being the backend's copy of
// the fp32 parameters); the backward's dout is out's storage, and the gradients are fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace scalestudy::cuda {

// A negative token id makes its output row NaN (the id cannot be checked on the host
// without a synchronisation); ids at or above the vocabulary are the data layer's to
// reject, since the vocabulary is not part of this op.
void launch_embedding_forward(cudaStream_t stream, float* out, const int32_t* tokens,
                              const float* wte, const float* wpe, int batch, int seq,
                              int channels);
void launch_embedding_forward(cudaStream_t stream, __nv_bfloat16* out, const int32_t* tokens,
                              const __nv_bfloat16* wte, const __nv_bfloat16* wpe, int batch, int seq,
                              int channels);
void launch_embedding_forward(cudaStream_t stream, __half* out, const int32_t* tokens,
                              const __half* wte, const __half* wpe, int batch, int seq,
                              int channels);
// dwte[tokens[n],:] += dout[n,:] and dwpe[t,:] += dout[b,t,:], deterministically: every
// gradient row is summed in increasing row order, the CPU backend's order, so the
// results are bit-identical to it (given the same dout values). Rows with a negative
// token add nothing to dwte. The token ids are sorted in scratch, of at least
// embedding_backward_scratch_elems floats.
size_t embedding_backward_scratch_elems(int batch, int seq);
void launch_embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const float* dout,
                               const int32_t* tokens, int batch, int seq, int channels, float* scratch,
                               size_t scratch_elems);
void launch_embedding_backward(cudaStream_t stream, float* dwte, float* dwpe,
                               const __nv_bfloat16* dout, const int32_t* tokens, int batch,
                               int seq, int channels, float* scratch, size_t scratch_elems);
void launch_embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const __half* dout,
                               const int32_t* tokens, int batch, int seq, int channels, float* scratch,
                               size_t scratch_elems);

}  // namespace scalestudy::cuda
