#include "backend/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <vector>

#include "attention.cuh"
#include "backend/cuda/cuda_storage.h"
#include "cuda_check.h"
#include "cross_entropy.cuh"
#include "dense_gelu.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "flash_attention.cuh"
#include "gelu.cuh"
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

void CudaOps::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int batch, int seq, int channels) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  with_storage_type(stores_half(out, "embedding out"), precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_embedding_forward(stream_, as<T>(out), tokens, parameter_as<T>(wte),
                                   parameter_as<T>(wpe), batch, seq, channels);
  });
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                 const int32_t* tokens, int batch, int seq, int channels) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(dwte, "embedding dwte");
  require_fp32(dwpe, "embedding dwpe");
  float* scratch = scratch_floats(cuda::embedding_backward_scratch_elems(batch, seq));
  with_storage_type(stores_half(dout, "embedding dout"), precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_embedding_backward(stream_, dwte, dwpe, as<T>(dout), tokens, batch, seq, channels,
                                    scratch, scratch_elems_);
  });
}

void CudaOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int rows,
                                int channels) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(mean, "layernorm mean");
  require_fp32(rstd, "layernorm rstd");
  const bool half = half_operands("layernorm_forward", {{out, "out"}, {inp, "inp"}});
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_layernorm_forward(stream_, as<T>(out), mean, rstd, as<T>(inp), parameter_as<T>(weight),
                                   parameter_as<T>(bias), rows, channels);
  });
}

void CudaOps::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int rows, int channels,
                                 GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  require_fp32(mean, "layernorm mean");
  require_fp32(rstd, "layernorm rstd");
  const bool half =
      half_operands("layernorm_backward", {{dinp, "dinp"}, {dout, "dout"}, {inp, "inp"}});
  const size_t scratch_elems = cuda::layernorm_backward_scratch_elems(rows, channels);
  float* scratch = scratch_floats(scratch_elems);
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_layernorm_backward(stream_, as<T>(dinp), dweight, dbias, as<T>(dout), as<T>(inp),
                                    parameter_as<T>(weight), mean, rstd, rows, channels, scratch,
                                    scratch_elems_, accumulate_dinp);
  });
}

void CudaOps::matmul_forward(float* out, const float* inp, const float* weight,
                             const float* bias, int rows, int in_channels, int out_channels) {
  ScopedKernelTag tag(KernelCategory::gemm);
  if (half_operands("matmul_forward", {{out, "out"}, {inp, "inp"}})) {
    const size_t scratch_elems = cuda::matmul_forward_scratch_elems_16bit(rows, out_channels);
    float* scratch = scratch_elems > 0 ? scratch_floats(scratch_elems) : nullptr;
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_matmul_forward(cublas_, stream_, as<Half>(out), as<Half>(inp), parameter_as<Half>(weight),
                                  bias != nullptr ? parameter_as<Half>(bias) : nullptr, rows, in_channels,
                                  out_channels, scratch, scratch != nullptr ? scratch_elems_ : 0,
                                  epilogue_gemm_.get());
    });
    return;
  }
  cuda::launch_matmul_forward(cublas_, stream_, out, inp, weight, bias, rows, in_channels,
                              out_channels);
}

void CudaOps::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int rows, int in_channels,
                              int out_channels, GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::gemm);
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  require_fp32(dweight, "matmul dweight");
  require_fp32(dbias, "matmul dbias");
  const bool half =
      half_operands("matmul_backward", {{dinp, "dinp"}, {dout, "dout"}, {inp, "inp"}});
  if (half) {
    // Scratch for the bias reduction and, where out_channels needs them, padded rows.
    float* scratch =
        scratch_floats(cuda::matmul_backward_scratch_elems_16bit(rows, out_channels));
    const void* weight_copy = parameter_copy_of(weight);
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_matmul_backward(cublas_, stream_, as<Half>(dinp), dweight, dbias,
                                   as<Half>(dout), as<Half>(inp), as<Half>(weight_copy), rows,
                                   in_channels, out_channels, scratch, scratch_elems_,
                                   accumulate_dinp);
    });
    return;
  }
  float* scratch = nullptr;
  if (dbias != nullptr)
    scratch = scratch_floats(cuda::matmul_backward_scratch_elems(rows, out_channels));
  const size_t scratch_elems = scratch != nullptr ? scratch_elems_ : 0;
  cuda::launch_matmul_backward(cublas_, stream_, dinp, dweight, dbias, dout, inp, weight, rows,
                               in_channels, out_channels, scratch, scratch_elems,
                               accumulate_dinp);
}

// The epilogue reads the bias from the parameters' 16-bit copy: a bias outside the
// parameters (or none) takes the plain ops, as does any shape cuBLASLt declines.
// bf16 only. In fp16 cuBLASLt's GELU epilogue missed the tanh GELU by more than the fp16
// rounding: on an H200 (CUDA 13, commit d8fc352), 14801 of 786432 outputs were off by up
// to ~8 fp16 ulps in the tails (-6.046e-4 against -6.083e-4), and 13075 derivatives
// likewise (docs/measurements/2026-11-22-h200-gelu-epilogue/). In bf16 the same
// differences stay within one bf16 rounding, which the GPU test
// GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu checks.
bool CudaOps::gelu_epilogues_allowed() const { return precision_ == Precision::bf16; }

void CudaOps::dense_gelu_forward(float* pre, float* out, const float* inp, const float* weight,
                                 const float* bias, int rows, int in_channels,
                                 int out_channels) {
  if (half_operands("dense_gelu_forward", {{pre, "pre"}, {out, "out"}, {inp, "inp"}}) &&
      bias != nullptr && gelu_epilogues_allowed()) {
    const void* bias_copy = parameter_copy_or_null(bias);
    bool fused = false;
    if (bias_copy != nullptr) {
      const void* weight_copy = parameter_copy_of(weight);
      ScopedKernelTag tag(KernelCategory::gemm);
      with_half_type(precision_, [&](auto storage) {
        using Half = typename decltype(storage)::type;
        fused = cuda::launch_dense_gelu_forward(*epilogue_gemm_, stream_, as<Half>(pre),
                                                as<Half>(out), as<Half>(inp),
                                                as<Half>(weight_copy), as<Half>(bias_copy), rows,
                                                in_channels, out_channels);
      });
    }
    if (fused) {
      ++gelu_epilogue_gemms_;
      return;
    }
  }
  Ops::dense_gelu_forward(pre, out, inp, weight, bias, rows, in_channels, out_channels);
}

// Where cuBLASLt declines the GELU's derivative in the epilogue nothing has been written,
// and the plain ops run instead, through dact_scratch.
void CudaOps::dense_backward_through_gelu(float* dpre, float* dweight, float* dbias,
                                          const float* dout, const float* act, const float* pre,
                                          const float* weight, int rows, int in_channels,
                                          int out_channels, float* dact_scratch) {
  if (half_operands("dense_backward_through_gelu", {{dpre, "dpre"}, {dout, "dout"}, {act, "act"},
                                                    {pre, "pre"}, {dact_scratch, "dact_scratch"}}) &&
      gelu_epilogues_allowed()) {
    require_fp32(dweight, "dense_backward_through_gelu dweight");
    require_fp32(dbias, "dense_backward_through_gelu dbias");
    float* scratch = nullptr;
    if (dbias != nullptr)
      scratch =
          scratch_floats(cuda::dense_backward_through_gelu_scratch_elems(rows, out_channels));
    const size_t scratch_elems = scratch != nullptr ? scratch_elems_ : 0;
    const void* weight_copy = parameter_copy_of(weight);
    bool fused = false;
    {
      ScopedKernelTag tag(KernelCategory::gemm);
      with_half_type(precision_, [&](auto storage) {
        using Half = typename decltype(storage)::type;
        fused = cuda::launch_dense_backward_through_gelu(
            *epilogue_gemm_, cublas_, stream_, as<Half>(dpre), dweight, dbias, as<Half>(dout),
            as<Half>(act), as<Half>(pre), as<Half>(weight_copy), rows, in_channels, out_channels,
            scratch, scratch_elems);
      });
    }
    if (fused) {
      ++gelu_epilogue_gemms_;
      return;
    }
  }
  Ops::dense_backward_through_gelu(dpre, dweight, dbias, dout, act, pre, weight, rows,
                                   in_channels, out_channels, dact_scratch);
}

float* CudaOps::allocate_attention_state(const AttentionShape& shape) {
  if (half_mode() && cuda::flash_attention_supported(shape))
    return allocate_statistics(static_cast<size_t>(shape.batch) * shape.heads * shape.seq);
  return allocate_floats(attention_probs_elems(shape), MemoryKind::activations);
}

// In bf16/fp16 an fp32 state is the fused kernels' log-sum-exp (allocate_attention_state).
bool CudaOps::fused_attention_state(const float* state, const AttentionShape& shape) const {
  if (!half_mode() || stores_half(state, "state")) return false;
  SCALESTUDY_CHECK(cuda::flash_attention_supported(shape),
                   "an fp32 attention state in " + std::string(mode_name()) +
                       " asks for the fused kernels, which do not take this shape");
  return true;
}

void CudaOps::attention_forward(float* out, float* state, const float* qkv,
                                const AttentionShape& shape) {
  ScopedKernelTag tag(KernelCategory::attention);
  if (fused_attention_state(state, shape)) {
    SCALESTUDY_CHECK(half_operands("attention_forward", {{out, "out"}, {qkv, "qkv"}}),
                     "the fused attention needs 16-bit out and qkv");
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_flash_attention_forward(stream_, as<Half>(out), state, as<Half>(qkv), shape);
    });
    return;
  }
  if (half_operands("attention_forward", {{out, "out"}, {state, "probs"}, {qkv, "qkv"}})) {
    float* scratch = scratch_floats(cuda::attention_forward_scratch_elems_16bit(shape));
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_attention_forward(cublas_, stream_, as<Half>(out), as<Half>(state),
                                     as<Half>(qkv), shape, scratch, scratch_elems_);
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
    float* scratch = scratch_floats(cuda::flash_attention_backward_scratch_elems(shape));
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_flash_attention_backward(stream_, as<Half>(dqkv), as<Half>(dout), as<Half>(qkv), as<Half>(out),
                                            state, shape, scratch, scratch_elems_,
                                            accumulate_dqkv);
    });
    return;
  }
  if (!accumulate_dqkv)
    fill_zero(dqkv, size_t(shape.batch) * shape.seq * 3 * size_t(shape.channels));
  if (half_operands("attention_backward",
                    {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {state, "probs"}})) {
    float* scratch = scratch_floats(cuda::attention_backward_scratch_elems_16bit(shape));
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_attention_backward(cublas_, stream_, as<Half>(dqkv), as<Half>(dout),
                                      as<Half>(qkv), as<Half>(state), shape, scratch,
                                      scratch_elems_);
    });
    return;
  }
  float* scratch = scratch_floats(cuda::attention_backward_scratch_elems(shape));
  cuda::launch_attention_backward(cublas_, stream_, dqkv, dout, qkv, state, shape, scratch,
                                  scratch_elems_);
}

void CudaOps::gelu_forward(float* out, const float* inp, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool half = half_operands("gelu_forward", {{out, "out"}, {inp, "inp"}});
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_gelu_forward(stream_, as<T>(out), as<T>(inp), elems);
  });
}

void CudaOps::gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems,
                            GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  const bool half = half_operands("gelu_backward", {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}});
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_gelu_backward(stream_, as<T>(dinp), as<T>(inp), as<T>(dout), elems,
                               accumulate_dinp);
  });
}

void CudaOps::residual_forward(float* out, const float* a, const float* b, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool half = half_operands("residual_forward", {{out, "out"}, {a, "a"}, {b, "b"}});
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_residual_forward(stream_, as<T>(out), as<T>(a), as<T>(b), elems);
  });
}

void CudaOps::residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd,
                                         const float* a, const float* b, const float* weight,
                                         const float* bias, int rows, int channels) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(mean, "layernorm mean");
  require_fp32(rstd, "layernorm rstd");
  const bool half = half_operands("residual_layernorm_forward",
                                  {{residual, "residual"}, {out, "out"}, {a, "a"}, {b, "b"}});
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_residual_layernorm_forward(stream_, as<T>(residual), as<T>(out), mean, rstd,
                                            as<T>(a), as<T>(b), parameter_as<T>(weight),
                                            parameter_as<T>(bias), rows, channels);
  });
}

void CudaOps::accumulate(float* dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool half = half_operands("accumulate", {{dst, "dst"}, {src, "src"}});
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
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
  require_fp32(losses, "cross-entropy losses");
  require_fp32(row_stats, "cross-entropy row statistics");
  SCALESTUDY_CHECK(padded_logits_stride(logits, rows, vocab) == 0,
                   "cross-entropy: padded logits from allocate_logits go to classifier_forward");
  with_storage_type(stores_half(logits, "cross-entropy logits"), precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_softmax_cross_entropy_forward(stream_, losses, row_stats, as<T>(logits), targets,
                                               rows, vocab, vocab);
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
  with_storage_type(half, precision_, [&](auto storage) {
    using T = typename decltype(storage)::type;
    cuda::launch_softmax_cross_entropy_backward(stream_, as<T>(dlogits), as<T>(logits), row_stats,
                                                targets, rows, vocab, vocab, loss_scale);
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

void CudaOps::classifier_forward(float* losses, float* row_stats, float* logits,
                                 const float* inp, const float* weight, const int32_t* targets,
                                 int rows, int channels, int vocab,
                                 std::optional<float> dlogits_scale) {
  const int stride = padded_logits_stride(logits, rows, vocab);
  if (stride == 0) {
    Ops::classifier_forward(losses, row_stats, logits, inp, weight, targets, rows, channels,
                            vocab, dlogits_scale);
    return;
  }
  require_fp32(losses, "cross-entropy losses");
  require_fp32(row_stats, "cross-entropy row statistics");
  SCALESTUDY_CHECK(stores_half(inp, "classifier inp"),
                   "classifier_forward: inp must be an activation buffer like the logits");
  const void* weight_copy = parameter_copy_of(weight);
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    {
      ScopedKernelTag tag(KernelCategory::gemm);
      cuda::launch_classifier_matmul_forward(cublas_, stream_, as<Half>(logits), stride,
                                             as<Half>(inp), as<Half>(weight_copy), rows, channels,
                                             vocab);
    }
    ScopedKernelTag tag(KernelCategory::norm_elementwise);
    if (dlogits_scale)
      cuda::launch_softmax_cross_entropy_forward_backward(stream_, losses, row_stats,
                                                          as<Half>(logits), targets, rows, vocab,
                                                          stride, *dlogits_scale);
    else
      cuda::launch_softmax_cross_entropy_forward(stream_, losses, row_stats, as<Half>(logits),
                                                 targets, rows, vocab, stride);
  });
}

// fp32 logits are the plain [N,V]; 16-bit ones come from allocate_logits, padded.
int CudaOps::classifier_logits_stride(const float* logits, int rows, int vocab) const {
  if (!half_mode()) return vocab;
  const int stride = padded_logits_stride(logits, rows, vocab);
  SCALESTUDY_CHECK(stride != 0, "classifier backward: 16-bit logits must come from allocate_logits");
  return stride;
}

void CudaOps::classifier_backward_from_dlogits(float* dinp, const float* dlogits,
                                               const float* weight, int rows, int channels,
                                               int vocab, GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::gemm);
  const int stride = classifier_logits_stride(dlogits, rows, vocab);
  const bool accumulate = dinp_write == GradientWrite::accumulate;
  if (!half_mode()) {
    cuda::launch_classifier_input_gradient(cublas_, stream_, dinp, dlogits, stride, weight, rows,
                                           channels, vocab, accumulate);
    return;
  }
  SCALESTUDY_CHECK(stores_half(dinp, "classifier dinp"),
                   "classifier_backward: dinp must be an activation buffer like the logits");
  const void* weight_copy = parameter_copy_of(weight);
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    cuda::launch_classifier_input_gradient(cublas_, stream_, as<Half>(dinp), as<Half>(dlogits),
                                           stride, as<Half>(weight_copy), rows, channels, vocab,
                                           accumulate);
  });
}

void CudaOps::classifier_weight_backward(float* dweight, const float* dlogits, const float* inp,
                                         int rows, int channels, int vocab, int vocab_begin,
                                         int vocab_end) {
  ScopedKernelTag tag(KernelCategory::gemm);
  require_fp32(dweight, "classifier dweight");
  const int stride = classifier_logits_stride(dlogits, rows, vocab);
  if (!half_mode()) {
    cuda::launch_classifier_weight_gradient(cublas_, stream_, dweight, dlogits, stride, inp, rows,
                                            channels, vocab, vocab_begin, vocab_end);
    return;
  }
  SCALESTUDY_CHECK(stores_half(inp, "classifier inp"),
                   "classifier_weight_backward: inp must be an activation buffer like the logits");
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    cuda::launch_classifier_weight_gradient(cublas_, stream_, dweight, as<Half>(dlogits), stride,
                                            as<Half>(inp), rows, channels, vocab, vocab_begin,
                                            vocab_end);
  });
}

void CudaOps::classifier_backward(float* dinp, float* logits, const float* row_stats,
                                  const float* weight, const int32_t* targets, int rows,
                                  int channels, int vocab, float loss_scale,
                                  GradientWrite dinp_write) {
  const int stride = padded_logits_stride(logits, rows, vocab);
  if (stride == 0) {
    Ops::classifier_backward(dinp, logits, row_stats, weight, targets, rows, channels, vocab,
                             loss_scale, dinp_write);
    return;
  }
  require_fp32(row_stats, "cross-entropy row statistics");
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    ScopedKernelTag tag(KernelCategory::norm_elementwise);
    cuda::launch_softmax_cross_entropy_backward(stream_, as<Half>(logits), as<Half>(logits),
                                                row_stats, targets, rows, vocab, stride,
                                                loss_scale);
  });
  classifier_backward_from_dlogits(dinp, logits, weight, rows, channels, vocab, dinp_write);
}

}  // namespace scalestudy
