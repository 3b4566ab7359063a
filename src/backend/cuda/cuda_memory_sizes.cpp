#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "attention.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_storage.h"
#include "backend/cuda/cudnn_attention.h"
#include "embedding.cuh"
#include "flash_attention.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"

// The sizes of what the CUDA backend allocates for a model, without allocating: the
// memory preflight's view of allocate_attention_state, allocate_logits and the ops'
// scratch, from the same size functions the allocations and launchers use.
namespace scalestudy {

using namespace cuda_storage;

bool CudaOps::uses_cudnn_attention(const AttentionShape& shape) const {
  return cudnn_attention_ != nullptr && cudnn_attention_supported(shape);
}

// cuDNN keeps the same statistics as the flash kernels (cudnn_attention.h), so the state
// is the log-sum-exp on either path.
bool CudaOps::keeps_log_sum_exp(const AttentionShape& shape) const {
  return half_mode() && (uses_cudnn_attention(shape) || cuda::flash_attention_supported(shape));
}

namespace {

// The preflight's allowance for cuDNN's attention workspace, which is known only once a
// graph is planned: an fp32 accumulator of dQ [B,T,C] and an fp32 value per query row
// [B,NH,T] (what its backward keeps beside the gradients), and with an accumulating backward
// the 16-bit gradients [B,T,3C] before they are added.
size_t cudnn_attention_scratch_elems(const AttentionShape& shape, bool accumulate) {
  const size_t tokens = static_cast<size_t>(shape.batch) * shape.seq;
  const size_t gradient_elems = accumulate ? tokens * 3 * shape.channels / 2 : 0;
  return tokens * shape.channels + tokens * shape.heads + gradient_elems;
}

}  // namespace

size_t CudaOps::attention_state_bytes(const AttentionShape& shape) const {
  if (keeps_log_sum_exp(shape)) return statistics_bytes(static_cast<size_t>(shape.batch) * shape.heads * shape.seq);
  return floats_bytes(attention_probs_elems(shape), MemoryKind::activations);
}

size_t CudaOps::logits_bytes(size_t rows, int vocab) const {
  const size_t row_elems = half_mode() ? static_cast<size_t>(cuda::padded_logits_row_elems(vocab)) : vocab;
  return floats_bytes(rows * row_elems, MemoryKind::activations);
}

// The scratch requests of the ops Gpt's forward and backward run (model/gpt.cpp): the
// embedding's and every LayerNorm's backward, the dense layers of 3C, C and 4C output
// channels (with the dense-GELU pair's), and the attention of its path. The classifier
// takes none. scratch_floats grows to at least kScratchGrowth times its old size, so the
// scratch ends below that factor times the largest request.
size_t CudaOps::model_scratch_bytes(const ModelShape& shape, int batch, int seq) const {
  const int rows = batch * seq, channels = shape.channels;
  const AttentionShape attention{batch, seq, channels, shape.heads, shape.causal};
  size_t largest_elems = std::max(cuda::embedding_backward_scratch_elems(batch, seq),
                                  cuda::layernorm_backward_scratch_elems(rows, channels));
  for (int out_channels : {3 * channels, channels, 4 * channels}) {
    largest_elems = std::max(largest_elems, half_mode()
                                                ? std::max(cuda::matmul_forward_scratch_elems_16bit(rows, out_channels),
                                                           cuda::matmul_backward_scratch_elems_16bit(rows, out_channels))
                                                : cuda::matmul_backward_scratch_elems(rows, out_channels));
  }
  if (half_mode())
    largest_elems = std::max(largest_elems, cuda::dense_backward_through_gelu_scratch_elems(rows, channels));
  // The model's attention backward overwrites dqkv (model/gpt.cpp).
  if (uses_cudnn_attention(attention))
    largest_elems = std::max(largest_elems, cudnn_attention_scratch_elems(attention, false));
  else if (keeps_log_sum_exp(attention))
    largest_elems = std::max(largest_elems, cuda::flash_attention_backward_scratch_elems(attention));
  else if (half_mode())
    largest_elems = std::max({largest_elems, cuda::attention_forward_scratch_elems_16bit(attention),
                              cuda::attention_backward_scratch_elems_16bit(attention)});
  else
    largest_elems = std::max(largest_elems, cuda::attention_backward_scratch_elems(attention));
  return static_cast<size_t>(std::ceil(kScratchGrowth * static_cast<double>(largest_elems))) * sizeof(float);
}

}  // namespace scalestudy
