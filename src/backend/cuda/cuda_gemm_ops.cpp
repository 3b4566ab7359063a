#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_storage.h"
#include "cross_entropy.cuh"
#include "cuda_check.h"
#include "gelu.cuh"
#include "gemm_lt.cuh"
#include "matmul.cuh"
#include "profile/kernel_tag.h"

// The CUDA backend's GEMM ops: the dense layers (with the bias and the GELU in cuBLASLt's
// epilogues where it takes them) and the classifier's LM head, through blas() and lt_gemm_.
namespace scalestudy {

using namespace cuda_storage;

// In 16 bits, augmented rows (op_params.h) where every dense layer after a LayerNorm runs
// on aligned rows: channels a multiple of 8, so that 3C and 4C are too.
int CudaOps::dense_input_stride(int channels) const {
  if (!half_mode() || channels % 8 != 0) return 0;
  return cuda::augmented_row_elems(channels);
}

// cuDNN's attention writes augmented rows through its output strides; the flash kernels
// and the unfused path write plain ones.
int CudaOps::attention_output_stride(const AttentionShape& shape) const {
  return uses_cudnn_attention(shape) ? dense_input_stride(shape.channels) : 0;
}

// The GELU epilogue writes augmented rows through its output's leading dimension; the plain
// ops (fp16's GELU kernels) write plain ones.
int CudaOps::gelu_output_stride(int channels) const {
  return gelu_epilogues_allowed() ? dense_input_stride(channels) : 0;
}

void CudaOps::matmul_forward(const MatmulForwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::gemm);
  if (!half_operands("matmul_forward", {{args.out, "out"}, {args.inp, "inp"}, {args.residual, "residual"}}))
    return cuda::launch_matmul_forward(blas(), stream_, args);
  const size_t scratch_elems = cuda::matmul_forward_scratch_elems_16bit(args.rows, args.out_channels);
  const cuda::Scratch scratch = scratch_elems > 0 ? scratch_of(scratch_elems) : cuda::Scratch{};
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    const MatmulForwardArgs<Half> half_args{
        .out = as<Half>(args.out),
        .inp = as<Half>(args.inp),
        .weight = parameter_as<Half>(args.weight),
        .bias = args.bias != nullptr ? parameter_as<Half>(args.bias) : nullptr,
        .rows = args.rows,
        .in_channels = args.in_channels,
        .out_channels = args.out_channels,
        .inp_stride = args.inp_stride,
        .residual = args.residual != nullptr ? as<Half>(args.residual) : nullptr};
    cuda::launch_matmul_forward(blas(), stream_, half_args, scratch, lt_gemm_.get());
  });
}

void CudaOps::matmul_backward(const MatmulBackwardArgs<float>& args) {
  ScopedKernelTag tag(KernelCategory::gemm);
  require_fp32({{args.dweight, "matmul dweight"}, {args.dbias, "matmul dbias"}});
  const bool half = half_operands("matmul_backward",
                                  {{args.dinp, "dinp"}, {args.dout, "dout"}, {args.inp, "inp"}});
  if (half) {
    // Scratch for the bias reduction and, where out_channels needs them, padded rows; over
    // augmented rows, for the weight gradient that holds the bias gradient.
    const cuda::Scratch scratch = scratch_of(
        args.inp_stride != 0
            ? cuda::augmented_weight_gradient_elems(args.in_channels, args.out_channels)
            : cuda::matmul_backward_scratch_elems_16bit(args.rows, args.out_channels));
    const void* weight_copy = parameter_copy_of(args.weight);
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      const MatmulBackwardArgs<Half> half_args{.dinp = as<Half>(args.dinp), .dweight = args.dweight,
                                               .dbias = args.dbias, .dout = as<Half>(args.dout),
                                               .inp = as<Half>(args.inp),
                                               .weight = as<Half>(weight_copy), .rows = args.rows,
                                               .in_channels = args.in_channels,
                                               .out_channels = args.out_channels,
                                               .dinp_write = args.dinp_write,
                                               .inp_stride = args.inp_stride};
      cuda::launch_matmul_backward(blas(), stream_, half_args, scratch);
    });
    return;
  }
  // Scratch for the bias gradient: the column sums' partials, or over augmented rows the
  // weight gradient that holds it.
  cuda::Scratch scratch;
  if (args.dbias != nullptr)
    scratch = scratch_of(args.inp_stride != 0
                             ? cuda::augmented_weight_gradient_elems(args.in_channels, args.out_channels)
                             : cuda::matmul_backward_scratch_elems(args.rows, args.out_channels));
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
                                               .out_channels = args.out_channels,
                                               .inp_stride = args.inp_stride,
                                               .out_stride = args.out_stride};
        fused = cuda::launch_dense_gelu_forward(*lt_gemm_, stream_, typed);
      });
    }
    if (fused) {
      ++gelu_epilogue_gemms_;
      return;
    }
  }
  SCALESTUDY_CHECK(args.out_stride == 0, "dense_gelu_forward: cuBLASLt declined the GELU epilogue for " +
                                             std::to_string(args.rows) + " rows of " +
                                             std::to_string(args.out_channels) +
                                             ", whose augmented rows (gelu_output_stride) only it writes");
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
    const size_t scratch_elems =
        args.act_stride != 0
            ? cuda::augmented_weight_gradient_elems(args.in_channels, args.out_channels)
            : cuda::dense_backward_through_gelu_scratch_elems(args.rows, args.out_channels);
    const cuda::Scratch scratch = args.dbias != nullptr ? scratch_of(scratch_elems) : cuda::Scratch{};
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
                                                    .dact_scratch = as<Half>(args.dact_scratch),
                                                    .act_stride = args.act_stride};
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
