#include "backend/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "attention.cuh"
#include "backend/cuda/cuda_storage.h"
#include "backend/cuda/cudnn_attention.h"
#include "cuda_check.h"
#include "cross_entropy.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "flash_attention.cuh"
#include "gelu.cuh"
#include "gemm.cuh"
#include "gemm_lt.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "profile/kernel_tag.h"

// The model's layer ops on the CUDA backend other than the GEMMs (cuda_gemm_ops.cpp):
// embedding, LayerNorm, attention, GELU, residuals and the cross-entropy, with the sizes the
// memory preflight takes of their buffers and scratch.
namespace scalestudy {

using namespace cuda_storage;

// ---- ops ----------------------------------------------------------------------------
// Each op asks the registry whether its activation operands are 16-bit (always false in
// fp32 mode, where nothing is looked up) and runs the matching kernels: with_half_type
// picks the instantiation for the precision's 16-bit type, bf16 or fp16, and
// with_storage_type also fp32's, where the launchers take the same arguments.

void CudaOps::embedding_forward(const EmbeddingForwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  with_storage_type(stores_half(args.out, "embedding out"), precision_, [&]<class T>(Storage<T>) {
    const EmbeddingForwardArgs<T> typed{.out = as<T>(args.out), .tokens = args.tokens,
                                        .wte = parameter_as<T>(args.wte),
                                        .wpe = parameter_as<T>(args.wpe), .batch = args.batch,
                                        .seq = args.seq, .channels = args.channels};
    cuda::launch_embedding_forward(stream_, typed);
  });
}

void CudaOps::embedding_backward(const EmbeddingBackwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32({{args.dwte, "embedding dwte"}, {args.dwpe, "embedding dwpe"}});
  const cuda::Scratch scratch =
      scratch_of(cuda::embedding_backward_scratch_elems(args.batch, args.seq));
  with_storage_type(stores_half(args.dout, "embedding dout"), precision_, [&]<class T>(Storage<T>) {
    const EmbeddingBackwardArgs<T> typed{.dwte = args.dwte, .dwpe = args.dwpe,
                                         .dout = as<T>(args.dout), .tokens = args.tokens,
                                         .batch = args.batch, .seq = args.seq,
                                         .channels = args.channels};
    cuda::launch_embedding_backward(stream_, typed, scratch);
  });
}

void CudaOps::layernorm_forward(const LayerNormForwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32({{args.mean, "layernorm mean"}, {args.rstd, "layernorm rstd"}});
  const bool half = half_operands("layernorm_forward", {{args.out, "out"}, {args.inp, "inp"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    const LayerNormForwardArgs<T> typed{.out = as<T>(args.out), .mean = args.mean,
                                        .rstd = args.rstd, .inp = as<T>(args.inp),
                                        .weight = parameter_as<T>(args.weight),
                                        .bias = parameter_as<T>(args.bias), .rows = args.rows,
                                        .channels = args.channels, .out_stride = args.out_stride};
    cuda::launch_layernorm_forward(stream_, typed);
  });
}

void CudaOps::layernorm_backward(const LayerNormBackwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32({{args.mean, "layernorm mean"}, {args.rstd, "layernorm rstd"}});
  const bool half = half_operands("layernorm_backward",
                                  {{args.dinp, "dinp"}, {args.dout, "dout"}, {args.inp, "inp"}});
  const cuda::Scratch scratch =
      scratch_of(cuda::layernorm_backward_scratch_elems(args.rows, args.channels));
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    const LayerNormBackwardArgs<T> typed{.dinp = as<T>(args.dinp), .dweight = args.dweight,
                                         .dbias = args.dbias, .dout = as<T>(args.dout),
                                         .inp = as<T>(args.inp),
                                         .weight = parameter_as<T>(args.weight), .mean = args.mean,
                                         .rstd = args.rstd, .rows = args.rows,
                                         .channels = args.channels, .dinp_write = args.dinp_write};
    cuda::launch_layernorm_backward(stream_, typed, scratch);
  });
}

float* CudaOps::allocate_attention_state(const AttentionShape& shape) {
  if (keeps_log_sum_exp(shape))
    return allocate_statistics(static_cast<size_t>(shape.batch) * shape.heads * shape.seq);
  return allocate_floats(attention_probs_elems(shape), MemoryKind::activations);
}

// In bf16/fp16 an fp32 state is the fused kernels' log-sum-exp (allocate_attention_state).
bool CudaOps::fused_attention_state(const float* state, const AttentionShape& shape) const {
  if (!half_mode() || stores_half(state, "state")) return false;
  SCALESTUDY_CHECK(keeps_log_sum_exp(shape),
                   "an fp32 attention state in " + std::string(mode_name()) +
                       " asks for the fused kernels, which do not take this shape");
  return true;
}

void CudaOps::cudnn_attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& shape) {
  const size_t workspace_bytes = cudnn_attention_->forward_workspace_bytes(shape);
  const cuda::Scratch workspace = scratch_of((workspace_bytes + sizeof(float) - 1) / sizeof(float));
  cudnn_attention_->forward({.out = out, .lse = lse, .qkv = qkv, .shape = shape}, workspace.data);
}

// cuDNN writes the gradients over its outputs. Accumulating, they land in the scratch after
// the workspace (16-byte aligned, as cuDNN's 16-bit tensors need) and are added to dqkv.
void CudaOps::cudnn_attention_backward(const AttentionBackwardArgs<float>& args) {
  constexpr size_t kAlignElems = 16 / sizeof(float);
  const size_t workspace_bytes = cudnn_attention_->backward_workspace_bytes(args.shape);
  const size_t workspace_elems = (workspace_bytes + 16 - 1) / 16 * kAlignElems;
  const size_t dqkv_elems = size_t(args.shape.batch) * args.shape.seq * 3 * size_t(args.shape.channels);
  const bool accumulate = args.dqkv_write == GradientWrite::accumulate;
  const size_t gradient_elems = accumulate ? (dqkv_elems * kHalfBytes + sizeof(float) - 1) / sizeof(float) : 0;
  const cuda::Scratch scratch = scratch_of(workspace_elems + gradient_elems);
  void* gradients = accumulate ? static_cast<void*>(scratch.data + workspace_elems) : static_cast<void*>(args.dqkv);
  cudnn_attention_->backward({.dqkv = gradients, .dout = args.dout, .qkv = args.qkv, .out = args.out,
                              .lse = args.state, .shape = args.shape},
                             scratch.data);
  if (!accumulate) return;
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    cuda::launch_accumulate(stream_, as<Half>(args.dqkv), static_cast<const Half*>(gradients), dqkv_elems);
  });
}

void CudaOps::attention_forward(float* out, float* state, const float* qkv,
                                const AttentionShape& shape) {
  ScopedKernelTag tag(KernelCategory::attention);
  check_attention_output_stride(shape);
  if (fused_attention_state(state, shape)) {
    SCALESTUDY_CHECK(half_operands("attention_forward", {{out, "out"}, {qkv, "qkv"}}),
                     "the fused attention needs 16-bit out and qkv");
    if (uses_cudnn_attention(shape)) {
      cudnn_attention_forward(out, state, qkv, shape);
      if (shape.out_stride == 0) return;
      with_half_type(precision_, [&]<class Half>(Storage<Half>) {
        cuda::launch_augmented_columns(stream_, as<Half>(out), shape.batch * shape.seq, shape.channels,
                                       shape.out_stride);
      });
      return;
    }
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      cuda::launch_flash_attention_forward(stream_, as<Half>(out), state, as<Half>(qkv), shape);
    });
    return;
  }
  if (half_operands("attention_forward", {{out, "out"}, {state, "probs"}, {qkv, "qkv"}})) {
    const cuda::Scratch scratch = scratch_of(cuda::attention_forward_scratch_elems_16bit(shape));
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      cuda::launch_attention_forward(cublas_, stream_, as<Half>(out), as<Half>(state),
                                     as<Half>(qkv), shape, scratch);
    });
    return;
  }
  cuda::launch_attention_forward(cublas_, stream_, out, state, qkv, shape);
}

void CudaOps::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                 const float* state, const AttentionShape& shape,
                                 GradientWrite dqkv_write) {
  ScopedKernelTag tag(KernelCategory::attention);
  check_attention_output_stride(shape);
  const bool accumulate_dqkv = dqkv_write == GradientWrite::accumulate;
  if (fused_attention_state(state, shape)) {
    SCALESTUDY_CHECK(half_operands("attention_backward", {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}}),
                     "the fused attention needs 16-bit dqkv, dout, qkv and out");
    if (uses_cudnn_attention(shape)) {
      cudnn_attention_backward({.dqkv = dqkv, .dout = dout, .qkv = qkv, .out = out, .state = state,
                                .shape = shape, .dqkv_write = dqkv_write});
      return;
    }
    const cuda::Scratch scratch = scratch_of(cuda::flash_attention_backward_scratch_elems(shape));
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      const AttentionBackwardArgs<Half, float> typed{.dqkv = as<Half>(dqkv), .dout = as<Half>(dout),
                                                     .qkv = as<Half>(qkv), .out = as<Half>(out),
                                                     .state = state, .shape = shape,
                                                     .dqkv_write = dqkv_write};
      cuda::launch_flash_attention_backward(stream_, typed, scratch);
    });
    return;
  }
  // The cuBLAS path accumulates: it overwrites as a zero fill followed by accumulating.
  if (!accumulate_dqkv)
    fill_zero(dqkv, size_t(shape.batch) * shape.seq * 3 * size_t(shape.channels));
  if (half_operands("attention_backward",
                    {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {state, "probs"}})) {
    const cuda::Scratch scratch = scratch_of(cuda::attention_backward_scratch_elems_16bit(shape));
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      const AttentionBackwardArgs<Half> typed{.dqkv = as<Half>(dqkv), .dout = as<Half>(dout),
                                              .qkv = as<Half>(qkv), .out = as<Half>(out),
                                              .state = as<Half>(state), .shape = shape};
      cuda::launch_attention_backward(cublas_, stream_, typed, scratch);
    });
    return;
  }
  const cuda::Scratch scratch = scratch_of(cuda::attention_backward_scratch_elems(shape));
  cuda::launch_attention_backward(
      cublas_, stream_,
      {.dqkv = dqkv, .dout = dout, .qkv = qkv, .out = out, .state = state, .shape = shape},
      scratch);
}

void CudaOps::gelu_forward(float* out, const float* inp, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool half = half_operands("gelu_forward", {{out, "out"}, {inp, "inp"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    cuda::launch_gelu_forward(stream_, as<T>(out), as<T>(inp), elems);
  });
}

void CudaOps::gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems,
                            GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  const bool half = half_operands("gelu_backward", {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    cuda::launch_gelu_backward(stream_, as<T>(dinp), as<T>(inp), as<T>(dout), elems,
                               accumulate_dinp);
  });
}

void CudaOps::accumulate(float* dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool half = half_operands("accumulate", {{dst, "dst"}, {src, "src"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    cuda::launch_accumulate(stream_, as<T>(dst), as<T>(src), elems);
  });
}

void CudaOps::softmax_cross_entropy_forward(float* losses, float* row_stats, const float* logits,
                                            const int32_t* targets, int rows, int vocab) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32({{losses, "cross-entropy losses"}, {row_stats, "cross-entropy row statistics"}});
  SCALESTUDY_CHECK(padded_logits_stride(logits, rows, vocab) == 0,
                   "cross-entropy: padded logits from allocate_logits go to classifier_forward");
  const bool half = stores_half(logits, "cross-entropy logits");
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    cuda::launch_softmax_cross_entropy_forward(stream_, losses, row_stats, as<T>(logits),
                                               {targets, rows, vocab, vocab});
  });
}

void CudaOps::softmax_cross_entropy_backward(float* dlogits, const float* logits,
                                             const float* row_stats, const int32_t* targets,
                                             int rows, int vocab, float loss_scale) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(row_stats, "cross-entropy row statistics");
  SCALESTUDY_CHECK(padded_logits_stride(logits, rows, vocab) == 0 &&
                       padded_logits_stride(dlogits, rows, vocab) == 0,
                   "cross-entropy: padded logits from allocate_logits go to classifier_backward");
  const bool half = half_operands("softmax_cross_entropy_backward",
                                  {{dlogits, "dlogits"}, {logits, "logits"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    cuda::launch_softmax_cross_entropy_backward(stream_, as<T>(dlogits), as<T>(logits), row_stats,
                                                {targets, rows, vocab, vocab}, loss_scale);
  });
}

// ---- sizes ---------------------------------------------------------------------------
// The sizes of what the ops allocate for a model, without allocating: the memory
// preflight's view of allocate_attention_state, allocate_logits and the ops' scratch, from
// the same size functions the allocations and launchers use.
bool CudaOps::uses_cudnn_attention(const AttentionShape& shape) const {
  return cudnn_attention_ != nullptr && cudnn_attention_supported(shape);
}

void CudaOps::check_attention_output_stride(const AttentionShape& shape) const {
  SCALESTUDY_CHECK(shape.out_stride == attention_output_stride(shape) || shape.out_stride == 0,
                   "attention: out's rows are " + std::to_string(shape.out_stride) +
                       " apart, where this path writes plain rows (attention_output_stride)");
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
  // The dense layers after the LayerNorms, of 3C and 4C outputs, over augmented rows.
  if (dense_input_stride(channels) != 0)
    largest_elems = std::max(largest_elems, cuda::augmented_weight_gradient_elems(channels, 4 * channels));
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
