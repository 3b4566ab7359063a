#include "backend/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// The model's layer ops on the CUDA backend; memory, copies, reductions and the optimizer
// are in cuda_ops.cpp.
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
                                        .channels = args.channels};
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

void CudaOps::matmul_forward(float* out, const float* inp, const float* weight,
                             const float* bias, int rows, int in_channels, int out_channels) {
  ScopedKernelTag tag(KernelCategory::gemm);
  if (half_operands("matmul_forward", {{out, "out"}, {inp, "inp"}})) {
    const size_t scratch_elems = cuda::matmul_forward_scratch_elems_16bit(rows, out_channels);
    const cuda::Scratch scratch = scratch_elems > 0 ? scratch_of(scratch_elems) : cuda::Scratch{};
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      const cuda::MatmulForwardArgs<Half> half_args{
          .out = as<Half>(out),
          .inp = as<Half>(inp),
          .weight = parameter_as<Half>(weight),
          .bias = bias != nullptr ? parameter_as<Half>(bias) : nullptr,
          .rows = rows,
          .in_channels = in_channels,
          .out_channels = out_channels};
      cuda::launch_matmul_forward(blas(), stream_, half_args, scratch, lt_gemm_.get());
    });
    return;
  }
  cuda::launch_matmul_forward(blas(), stream_,
                              {.out = out, .inp = inp, .weight = weight, .bias = bias, .rows = rows,
                               .in_channels = in_channels, .out_channels = out_channels});
}

void CudaOps::matmul_backward(const MatmulBackwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::gemm);
  require_fp32({{args.dweight, "matmul dweight"}, {args.dbias, "matmul dbias"}});
  const bool half = half_operands("matmul_backward",
                                  {{args.dinp, "dinp"}, {args.dout, "dout"}, {args.inp, "inp"}});
  if (half) {
    // Scratch for the bias reduction and, where out_channels needs them, padded rows.
    const cuda::Scratch scratch =
        scratch_of(cuda::matmul_backward_scratch_elems_16bit(args.rows, args.out_channels));
    const void* weight_copy = parameter_copy_of(args.weight);
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      const MatmulBackwardArgs<Half> half_args{.dinp = as<Half>(args.dinp), .dweight = args.dweight,
                                               .dbias = args.dbias, .dout = as<Half>(args.dout),
                                               .inp = as<Half>(args.inp),
                                               .weight = as<Half>(weight_copy), .rows = args.rows,
                                               .in_channels = args.in_channels,
                                               .out_channels = args.out_channels,
                                               .dinp_write = args.dinp_write};
      cuda::launch_matmul_backward(blas(), stream_, half_args, scratch);
    });
    return;
  }
  const cuda::Scratch scratch =
      args.dbias != nullptr
          ? scratch_of(cuda::matmul_backward_scratch_elems(args.rows, args.out_channels))
          : cuda::Scratch{};
  cuda::launch_matmul_backward(blas(), stream_, args, scratch);
}

// The epilogue reads the bias from the parameters' 16-bit copy: a bias outside the
// parameters (or none) takes the plain ops, as does any shape cuBLASLt declines.
// bf16 only. In fp16 cuBLASLt's GELU epilogue misses the tanh GELU by more than the fp16
// rounding: on an H200 (CUDA 13), 14801 of 786432 outputs are off by up to ~8 fp16 ulps
// in the tails (-6.046e-4 against -6.083e-4), and 13075 derivatives likewise. In bf16 the
// same differences stay within one bf16 rounding, which the GPU test
// GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu checks.
bool CudaOps::gelu_epilogues_allowed() const { return precision_ == Precision::bf16; }

void CudaOps::dense_gelu_forward(const DenseGeluForwardArgs<float>& args) {
  if (half_operands("dense_gelu_forward",
                    {{args.pre, "pre"}, {args.out, "out"}, {args.inp, "inp"}}) &&
      args.bias != nullptr && gelu_epilogues_allowed()) {
    const void* bias_copy = parameter_copy_or_null(args.bias);
    bool fused = false;
    if (bias_copy != nullptr) {
      const void* weight_copy = parameter_copy_of(args.weight);
      ScopedKernelTag tag(KernelCategory::gemm);
      with_half_type(precision_, [&]<class Half>(Storage<Half>) {
        const DenseGeluForwardArgs<Half> typed{.pre = as<Half>(args.pre), .out = as<Half>(args.out),
                                               .inp = as<Half>(args.inp),
                                               .weight = as<Half>(weight_copy),
                                               .bias = as<Half>(bias_copy), .rows = args.rows,
                                               .in_channels = args.in_channels,
                                               .out_channels = args.out_channels};
        fused = cuda::launch_dense_gelu_forward(*lt_gemm_, stream_, typed);
      });
    }
    if (fused) {
      ++gelu_epilogue_gemms_;
      return;
    }
  }
  Ops::dense_gelu_forward(args);
}

// Where cuBLASLt declines the GELU's derivative in the epilogue nothing has been written,
// and the plain ops run instead, through dact_scratch.
void CudaOps::dense_backward_through_gelu(const DenseGeluBackwardArgs<float>& args) {
  if (half_operands("dense_backward_through_gelu",
                    {{args.dpre, "dpre"}, {args.dout, "dout"}, {args.act, "act"}, {args.pre, "pre"},
                     {args.dact_scratch, "dact_scratch"}}) &&
      gelu_epilogues_allowed()) {
    require_fp32({{args.dweight, "dense_backward_through_gelu dweight"},
                  {args.dbias, "dense_backward_through_gelu dbias"}});
    const cuda::Scratch scratch =
        args.dbias != nullptr ? scratch_of(cuda::dense_backward_through_gelu_scratch_elems(
                                    args.rows, args.out_channels))
                              : cuda::Scratch{};
    const void* weight_copy = parameter_copy_of(args.weight);
    bool fused = false;
    {
      ScopedKernelTag tag(KernelCategory::gemm);
      with_half_type(precision_, [&]<class Half>(Storage<Half>) {
        const DenseGeluBackwardArgs<Half> half_args{.dpre = as<Half>(args.dpre),
                                                    .dweight = args.dweight, .dbias = args.dbias,
                                                    .dout = as<Half>(args.dout),
                                                    .act = as<Half>(args.act),
                                                    .pre = as<Half>(args.pre),
                                                    .weight = as<Half>(weight_copy),
                                                    .rows = args.rows,
                                                    .in_channels = args.in_channels,
                                                    .out_channels = args.out_channels,
                                                    .dact_scratch = as<Half>(args.dact_scratch)};
        fused = cuda::launch_dense_backward_through_gelu(*lt_gemm_, blas(), stream_,
                                                         half_args, scratch);
      });
    }
    if (fused) {
      ++gelu_epilogue_gemms_;
      return;
    }
  }
  Ops::dense_backward_through_gelu(args);
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
  if (fused_attention_state(state, shape)) {
    SCALESTUDY_CHECK(half_operands("attention_forward", {{out, "out"}, {qkv, "qkv"}}),
                     "the fused attention needs 16-bit out and qkv");
    if (uses_cudnn_attention(shape)) {
      cudnn_attention_forward(out, state, qkv, shape);
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

void CudaOps::residual_forward(float* out, const float* a, const float* b, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool half = half_operands("residual_forward", {{out, "out"}, {a, "a"}, {b, "b"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    cuda::launch_residual_forward(stream_, as<T>(out), as<T>(a), as<T>(b), elems);
  });
}

void CudaOps::residual_layernorm_forward(const ResidualLayerNormForwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32({{args.mean, "layernorm mean"}, {args.rstd, "layernorm rstd"}});
  const bool half =
      half_operands("residual_layernorm_forward",
                    {{args.residual, "residual"}, {args.out, "out"}, {args.a, "a"}, {args.b, "b"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    const ResidualLayerNormForwardArgs<T> typed{.residual = as<T>(args.residual),
                                                .out = as<T>(args.out), .mean = args.mean,
                                                .rstd = args.rstd, .a = as<T>(args.a),
                                                .b = as<T>(args.b),
                                                .weight = parameter_as<T>(args.weight),
                                                .bias = parameter_as<T>(args.bias),
                                                .rows = args.rows, .channels = args.channels};
    cuda::launch_residual_layernorm_forward(stream_, typed);
  });
}

void CudaOps::accumulate(float* dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool half = half_operands("accumulate", {{dst, "dst"}, {src, "src"}});
  with_storage_type(half, precision_, [&]<class T>(Storage<T>) {
    cuda::launch_accumulate(stream_, as<T>(dst), as<T>(src), elems);
  });
}

int CudaOps::padded_logits_stride(const float* logits, int rows, int vocab) const {
  if (!half_mode() || logits == nullptr) return 0;
  const Lookup lookup = find_allocation(logits);
  if (!lookup.found || lookup.allocation.logits_row_elems == 0) return 0;
  const int stride = lookup.allocation.logits_row_elems;
  SCALESTUDY_CHECK(reinterpret_cast<uintptr_t>(logits) == lookup.base &&
                       stride == cuda::padded_logits_row_elems(vocab) &&
                       lookup.allocation.bytes >= size_t(rows) * stride * kHalfBytes,
                   "cuda backend: a logits buffer from allocate_logits is used with other rows "
                   "or another vocabulary than it was allocated for");
  return stride;
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

float* CudaOps::allocate_logits(int rows, int vocab) {
  if (!half_mode()) return allocate_floats(size_t(rows) * vocab, MemoryKind::activations);
  SCALESTUDY_CHECK(rows > 0 && vocab > 0, "allocate_logits: rows and vocab must be positive");
  const int stride = cuda::padded_logits_row_elems(vocab);
  float* logits = allocate_floats(size_t(rows) * stride, MemoryKind::activations);
  // The padding columns are never read; zeroed, they hold no NaN for a debugger to find.
  CHECK_CUDA(cudaMemsetAsync(logits, 0, size_t(rows) * stride * kHalfBytes, stream_));
  std::lock_guard<std::mutex> lock(memory_mutex_);
  allocations_.at(reinterpret_cast<uintptr_t>(logits)).logits_row_elems = stride;
  return logits;
}

void CudaOps::classifier_forward(const ClassifierForwardArgs<float>& args) {
  // Logits not from allocate_logits (fp32, or a plain buffer) take Ops's plain ops.
  const int stride = padded_logits_stride(args.logits, args.rows, args.vocab);
  if (stride == 0) return Ops::classifier_forward(args);
  require_fp32({{args.losses, "cross-entropy losses"},
                {args.row_stats, "cross-entropy row statistics"}});
  SCALESTUDY_CHECK(stores_half(args.inp, "classifier inp"),
                   "classifier_forward: inp must be an activation buffer like the logits");
  const void* weight_copy = parameter_copy_of(args.weight);
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    const ClassifierForwardArgs<Half> half_args{.losses = args.losses, .row_stats = args.row_stats,
                                                .logits = as<Half>(args.logits),
                                                .inp = as<Half>(args.inp),
                                                .weight = as<Half>(weight_copy),
                                                .targets = args.targets, .rows = args.rows,
                                                .channels = args.channels, .vocab = args.vocab,
                                                .dlogits_scale = args.dlogits_scale};
    {
      ScopedKernelTag tag(KernelCategory::gemm);
      cuda::launch_classifier_matmul_forward(blas(), stream_, half_args, stride);
    }
    if (args.losses == nullptr) return;
    ScopedKernelTag tag(KernelCategory::norm_elementwise);
    const cuda::CrossEntropyRows rows{args.targets, args.rows, args.vocab, stride};
    if (args.dlogits_scale)
      cuda::launch_softmax_cross_entropy_forward_backward(stream_, args.losses, args.row_stats,
                                                          half_args.logits, rows,
                                                          *args.dlogits_scale);
    else
      cuda::launch_softmax_cross_entropy_forward(stream_, args.losses, args.row_stats,
                                                 static_cast<const Half*>(half_args.logits), rows);
  });
}

// fp32 logits are the plain [N,V]; 16-bit ones come from allocate_logits, padded.
int CudaOps::classifier_logits_stride(const float* logits, int rows, int vocab) const {
  if (!half_mode()) return vocab;
  const int stride = padded_logits_stride(logits, rows, vocab);
  SCALESTUDY_CHECK(stride != 0, "classifier backward: 16-bit logits must come from allocate_logits");
  return stride;
}

void CudaOps::classifier_backward_from_dlogits(const ClassifierInputGradientArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::gemm);
  const int stride = classifier_logits_stride(args.dlogits, args.rows, args.vocab);
  if (!half_mode()) return cuda::launch_classifier_input_gradient(blas(), stream_, args, stride);
  SCALESTUDY_CHECK(stores_half(args.dinp, "classifier dinp"),
                   "classifier_backward: dinp must be an activation buffer like the logits");
  const void* weight_copy = parameter_copy_of(args.weight);
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    const ClassifierInputGradientArgs<Half> half_args{.dinp = as<Half>(args.dinp),
                                                      .dlogits = as<Half>(args.dlogits),
                                                      .weight = as<Half>(weight_copy),
                                                      .rows = args.rows, .channels = args.channels,
                                                      .vocab = args.vocab,
                                                      .dinp_write = args.dinp_write};
    cuda::launch_classifier_input_gradient(blas(), stream_, half_args, stride);
  });
}

void CudaOps::classifier_weight_backward(const ClassifierWeightGradientArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::gemm);
  require_fp32(args.dweight, "classifier dweight");
  const int stride = classifier_logits_stride(args.dlogits, args.rows, args.vocab);
  if (!half_mode()) return cuda::launch_classifier_weight_gradient(blas(), stream_, args, stride);
  SCALESTUDY_CHECK(stores_half(args.inp, "classifier inp"),
                   "classifier_weight_backward: inp must be an activation buffer like the logits");
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    const ClassifierWeightGradientArgs<Half> half_args{.dweight = args.dweight,
                                                       .dlogits = as<Half>(args.dlogits),
                                                       .inp = as<Half>(args.inp), .rows = args.rows,
                                                       .channels = args.channels,
                                                       .vocab = args.vocab,
                                                       .vocab_begin = args.vocab_begin,
                                                       .vocab_end = args.vocab_end};
    cuda::launch_classifier_weight_gradient(blas(), stream_, half_args, stride);
  });
}

void CudaOps::classifier_backward(const ClassifierBackwardArgs<float>& args) {
  // Logits not from allocate_logits (fp32, or a plain buffer) take Ops's plain ops.
  const int stride = padded_logits_stride(args.logits, args.rows, args.vocab);
  if (stride == 0) return Ops::classifier_backward(args);
  require_fp32(args.row_stats, "cross-entropy row statistics");
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    ScopedKernelTag tag(KernelCategory::norm_elementwise);
    cuda::launch_softmax_cross_entropy_backward(stream_, as<Half>(args.logits), as<Half>(args.logits),
                                                args.row_stats,
                                                {args.targets, args.rows, args.vocab, stride},
                                                args.loss_scale);
  });
  classifier_backward_from_dlogits(input_gradient_of(args));
}

}  // namespace scalestudy
