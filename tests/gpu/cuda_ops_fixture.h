#pragma once
// The fixture of the CUDA op tests: a CudaOps in fp32, bf16 or fp16, every op against the
// CPU reference (the oracle) on identical inputs, the tolerances, each derived next to its
// name, and the helpers that round like the backend's storage.
//
// Each check is |gpu - cpu| <= atol + rtol*|cpu|, with the tolerance named per op below
// and the first mismatch printed. Outputs that an op overwrites are NaN-poisoned on the
// GPU first, so an element the GPU never writes fails; gradient outputs start from the
// same random "prior" on both sides, so a GPU backward that overwrites instead of
// accumulating fails too. Inputs are random with fixed seeds and never all zero.
//
// In bf16 and fp16, inputs that the GPU stores in 16 bits are rounded to that type on the
// host first, so the CPU reference computes from exactly the values the GPU holds. What
// remains is the GPU's own rounding. bf16 keeps 8 significant bits: rounding to nearest
// has relative error at most u = 2^-8 = 3.9e-3, and 1 ulp is at most 2^-7 = 7.8e-3
// relative. fp16 keeps 11: u = 2^-11 = 4.9e-4, 1 ulp <= 2^-10 = 9.8e-4 relative, for
// normal numbers (from 2^-14 = 6.1e-5); below that fp16's subnormals are spaced 2^-24 =
// 6.0e-8 apart, an absolute error. In fp32 the rounding is the identity.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/half_host.h"
#include "cross_entropy.cuh"
#include "cuda_check.h"
#include "cuda_test_support.h"
#include "gemm_lt.cuh"

namespace scalestudy::gpu_test {

// ---- tolerances of fp32 results -------------------------------------------------------
// Measured on an H100 (sm_90, CUDA 13.0): every fp32 check stayed within 0.41 of its bound,
// the closest being the LM head's dinp (1000-term dot products) under kDotProduct.
// Bit-identical: ops whose per-element arithmetic is the same sequence of IEEE fp32
// operations on both backends (the CUDA kernels use non-fusing __f*_rn intrinsics, and
// sums run in the CPU's order): embedding, residual, accumulate, scale, fill, the
// cross-entropy backward and AdamW. In 16 bits: gpu == round(cpu) in the storage type for
// ops whose fp32 arithmetic is the same sequence of operations on both sides, rounded once
// on the GPU (embedding, residual, accumulate, the cross-entropy backward), and fp32
// results whose fp32 counterparts are bit-identical (the embedding gradients).
constexpr Tolerance kBitExact{0.0, 0.0};
// LayerNorm forward and its input gradient: row statistics in double on both sides,
// summed in different orders (differences ~1e-16 that can flip the last bit of the fp32
// mean or rstd), then identical per-element arithmetic: a few fp32 ulps of O(1) values.
constexpr Tolerance kRowStatistics{1e-6, 1e-6};
// Column sums over N <= 128 rows (LayerNorm dweight/dbias, matmul dbias): the CPU adds
// the rows one by one in fp32, whose rounding error grows like sqrt(N)*2^-24*|partial
// sums| ~ 1e-5 at most for O(1) terms; the GPU's chunked sums are more accurate still.
constexpr Tolerance kColumnSum{5e-5, 1e-5};
// Column sums of O(1) terms over tens of thousands of rows, against double sums (the CPU's
// fp32 sums lose ~sqrt(N)*2^-24*|partial sums| there): the GPU adds at most 16 rows a
// lane and 8 lanes in fp32, about 24 roundings of partial sums of ~sqrt(128) terms a chunk
// (~2e-5), and ~500 chunks in double, ~sqrt(500)*2e-5 = 5e-4 at most on sums of ~sqrt(N)
// ~ 180; a chunk lost or counted twice would be O(1) off.
constexpr Tolerance kManyRowColumnSum{1e-3, 1e-5};
// Dot products of up to 1000 O(1) terms (matmul, attention; the LM head's dinp sums over
// V) in different orders: the CPU with 8 lanes, cuBLAS with its own tiling and fused
// multiply-adds. Each side's error is ~sqrt(K)*2^-24*|partial sums| <~ 2e-5 for results
// of ~10; a wrong index or a lost accumulation is O(1). Weight gradients in 16 bits are
// fp32 GEMMs of 16-bit operands: the products (8x8 or 11x11 significant bits) are exact in
// fp32 and the tensor cores accumulate in fp32, so this bound applies to them too.
constexpr Tolerance kDotProduct{5e-5, 1e-5};
// Softmax outputs (attention probabilities, cross-entropy probabilities and loss): expf
// on the GPU is within 2 ulp of glibc's, sums are in double: a few ulps relative. The
// 16-bit modes' losses keep it: a log-sum-exp in double of the stored logits.
constexpr Tolerance kSoftmax{1e-7, 2e-6};
// GELU: tanhf within 2 ulp of glibc's. Forward: 0.5*x*(1+tanh) moves by ~|x|*1e-7. The
// backward's 1 - tanh^2 cancels as |tanh| -> 1, so its absolute error is scaled by
// 0.5*|x|*dinner ~ 10 at |x| = 5.
constexpr Tolerance kGeluForward{1e-6, 1e-6};
constexpr Tolerance kGeluBackward{5e-6, 1e-6};
// Whole-buffer sums in double, in different orders: relative to sum|x|, each side is
// within n*2^-53 ~ 1e-10 of exact; the check uses atol = kDoubleSumRelative*sum|x|.
constexpr double kDoubleSumRelative = 1e-11;
// Whole model (2 layers, GPT-2 initialisation), loss and every gradient: the per-op
// differences above pass through ~20 ops. Gradients are compared per tensor with atol
// scaled by the tensor's largest |gradient|, since elements near zero carry no relative
// accuracy. On an H100 the largest differences were ~1e-9 relative on the loss and
// ~5e-7 of max|gradient|, so both bounds leave a margin of ~40x or more, while a wrong
// term changes gradients at O(1) of that scale.
constexpr Tolerance kModelLoss{1e-7, 1e-6};
constexpr Tolerance kModelGradient{2e-5 /* times max|grad| of the tensor */, 1e-4};
// The tanh GELU's slope lies in [-0.129, 1.129]: an error in its input moves its output by
// at most 1.13 times as much.
constexpr double kGeluMaxSlope = 1.13;

// ---- tolerances set by the storage type ---------------------------------------------------
// On an H200 (sm_90, CUDA 13.0), bf16: every per-op check uses at most 0.39 of its bound
// (the pure-rounding ones sit at u/1e-2 = 0.39: no result lands on a neighbouring bf16
// value); the bf16 model's loss is within 1.5e-5 of the fp32 CPU's, its gradients within
// 7.7e-3 norm-wise (block0.ln1.weight the worst). fp16's bounds are bf16's divided by 8 =
// 2^(11-8) wherever the storage rounding sets them, so the same derivation leaves the same
// margins. fp32's are the bounds above that the 16-bit ones widen.
struct PrecisionTolerances {
  // One rounding of an fp32 value that differs from the CPU's by a few fp32 ulps (tanhf,
  // expf, or sums in another order): the nearest or the neighbouring 16-bit value, within
  // 1 ulp relative (rtol: 1e-2 >= 2^-7 for bf16, 1.25e-3 >= 2^-10 for fp16); atol keeps
  // the fp32 suite's absolute allowance for results near zero (LayerNorm 1e-6; GELU's
  // backward 5e-6, where 1 - tanh^2 cancels in fp32 on both sides), which also covers
  // fp16's subnormal spacing (6e-8). fp32: kRowStatistics, which is kGeluForward too.
  Tolerance rounding;
  Tolerance gelu_backward;
  // Probabilities (attention, cross-entropy): one rounding of a value within a few fp32
  // ulps of the CPU's, rtol as above; atol only for probabilities below the normal range:
  // bf16 has fp32's range (1e-30 covers underflow), fp16's subnormals below 6.1e-5 are
  // 2^-24 = 5.96e-8 apart (atol 6e-8 = one subnormal step).
  Tolerance probability;
  // Attention output: the GPU multiplies V by the 16-bit-rounded probabilities, each off
  // by u relative, so |error| <= u*sum_t2 p*|v| <= u*max|v| = u for v in [-1, 1], plus the
  // final rounding: atol >= u (5e-3 for bf16, 6.25e-4 for fp16), rtol as `rounding`.
  Tolerance attention_out;
  // 16-bit GEMM results (matmul out and dinp, attention dqkv): an fp32 dot product rounded
  // once (u relative to the result), but also intermediate roundings that are relative to
  // a term rather than to the result: the GEMM output before the bias add (u*|x.w|, with
  // |x.w| <= |out| + |bias|), dS before the dQ/dK GEMMs (u*sum|dS||K|), and (bf16 only;
  // the fp16 handle keeps them in fp32) split-K partial sums reduced in the output type.
  // So atol is relative to the tensor's scale, max|ref|: 2.56u of it (1e-2 for bf16,
  // 1.25e-3 for fp16); a wrong index or a lost accumulation is O(1) of it. fp32 GEMMs take
  // kDotProduct instead (gemm_tolerance).
  double gemm_scaled_atol;
  double gemm_rtol;
  // Whole model (2 layers, GPT-2 initialisation) against the fp32 CPU model: ~20 ops,
  // each adding roundings of about u relative to its outputs. The loss must agree to
  // model_loss_relative; each parameter tensor's gradient to model_gradient_norm_relative
  // in norm, ||g - g_ref|| / ||g_ref|| (element-wise bounds mean little after 20
  // roundings; a wrong or missing term changes the norm at O(1)). fp32 compares element
  // by element instead (kModelLoss, kModelGradient).
  double model_loss_relative;
  double model_gradient_norm_relative;
  // The model's backward runs with loss_scale = model_loss_scale / (batch*seq), on the CPU
  // as on the GPU (the norm-wise comparison does not depend on it). fp16 scales by 2^10,
  // as the trainer's loss scaling would: unscaled, this small model's activation
  // gradients (~1e-5) would sit in fp16's subnormals, where the storage keeps absolute
  // rather than relative precision; scaled they are ~1e-2, and the largest (dlogits) ~20.
  float model_loss_scale;
};

constexpr PrecisionTolerances kFp32Tolerances{
    /*rounding=*/kRowStatistics,
    /*gelu_backward=*/kGeluBackward,
    /*probability=*/kSoftmax,
    /*attention_out=*/kDotProduct,
    /*gemm_scaled_atol=*/0.0,
    /*gemm_rtol=*/0.0,
    /*model_loss_relative=*/0.0,
    /*model_gradient_norm_relative=*/0.0,
    /*model_loss_scale=*/1.0f,
};

constexpr PrecisionTolerances kBf16Tolerances{
    /*rounding=*/{1e-6, 1e-2},
    /*gelu_backward=*/{5e-6, 1e-2},
    /*probability=*/{1e-30, 1e-2},
    /*attention_out=*/{5e-3, 1e-2},
    /*gemm_scaled_atol=*/1e-2,
    /*gemm_rtol=*/1e-2,
    /*model_loss_relative=*/1e-2,
    /*model_gradient_norm_relative=*/5e-2,
    /*model_loss_scale=*/1.0f,
};

constexpr PrecisionTolerances kFp16Tolerances{
    /*rounding=*/{1e-6, 1.25e-3},
    /*gelu_backward=*/{5e-6, 1.25e-3},
    /*probability=*/{6e-8, 1.25e-3},
    /*attention_out=*/{6.25e-4, 1.25e-3},
    /*gemm_scaled_atol=*/1.25e-3,
    /*gemm_rtol=*/1.25e-3,
    /*model_loss_relative=*/1.25e-3,
    /*model_gradient_norm_relative=*/6.25e-3,
    /*model_loss_scale=*/1024.0f,
};

inline const PrecisionTolerances& tolerances_of(Precision precision) {
  switch (precision) {
    case Precision::bf16: return kBf16Tolerances;
    case Precision::fp16: return kFp16Tolerances;
    case Precision::fp32: break;
  }
  return kFp32Tolerances;
}

// u, the relative error of one rounding to a 16-bit storage type.
inline double unit_roundoff(Precision precision) {
  return precision == Precision::fp16 ? 0x1p-11 : 0x1p-8;
}

inline double max_abs(const std::vector<float>& values) {
  double largest = 0.0;
  for (float value : values) largest = std::max(largest, double{std::fabs(value)});
  return largest;
}

// A CudaOps in one precision (fp32 unless named), with the helpers that round like its
// storage. In fp32 every rounding is the identity and every buffer fp32.
class CudaOpsTest : public gpu_test::CudaOpsFixture {
 protected:
  explicit CudaOpsTest(Precision precision = Precision::fp32)
      : CudaOpsFixture(precision), tol_(tolerances_of(precision)) {}

  bool half() const { return precision_ != Precision::fp32; }
  // The values the storage holds for `values`.
  std::vector<float> rounded(std::vector<float> values) const {
    for (float& value : values) value = round_to_storage(precision_, value);
    return values;
  }
  Tolerance gemm_tolerance(const std::vector<float>& ref) const {
    if (!half()) return kDotProduct;
    return Tolerance{tol_.gemm_scaled_atol * max_abs(ref), tol_.gemm_rtol};
  }
  // The GELU of a GEMM result x, or the GELU's derivative times one: x's error (within
  // gemm_tolerance, at most (gemm_scaled_atol + gemm_rtol) * max|x|) reaches the result at
  // most kGeluMaxSlope times larger - relative to x's scale, not to the result's, which is
  // ~100 times smaller than x past x = -3 - and the result is rounded once more (gemm_rtol).
  // The fused path's GELU takes x before its 16-bit rounding, the plain path after it: both
  // lie within this.
  Tolerance gelu_of_gemm_tolerance(const std::vector<float>& gemm_ref) const {
    return Tolerance{kGeluMaxSlope * (tol_.gemm_scaled_atol + tol_.gemm_rtol) * max_abs(gemm_ref),
                     tol_.gemm_rtol};
  }
  std::string name() const { return precision_name(precision_); }

  // An activation buffer holding `values` (which should already be rounded): 16-bit in
  // bf16 and fp16.
  float* activation(const std::vector<float>& values) {
    return upload(values, MemoryKind::activations);
  }
  float* poisoned_activation(size_t elems) { return poisoned(elems, MemoryKind::activations); }
  // Parameters as the model keeps them: fp32 masters in a MemoryKind::parameters
  // allocation, whose 16-bit copy (refreshed here) is what the ops read in bf16 and fp16.
  // So the CPU reference takes rounded(values).
  float* parameters(const std::vector<float>& values) {
    float* device = upload(values, MemoryKind::parameters);
    gpu_->parameters_changed(device, 0, values.size());
    return device;
  }
  // An fp32 statistics buffer from allocate_statistics, as the model's, NaN-poisoned.
  float* poisoned_statistics(size_t elems) {
    float* device = gpu_->allocate_statistics(elems);
    owned_.push_back(device);
    const std::vector<float> nan(elems, NAN);
    gpu_->copy_from_host(device, nan.data(), elems);
    return device;
  }
  // The check, printing how much of the bound the worst element used.
  void expect_close(const std::string& what, const float* device, const std::vector<float>& ref,
                    Tolerance tolerance) {
    const auto result = all_close(what, download(device, ref.size()), ref, tolerance);
    EXPECT_TRUE(result);
    if (result)
      std::cout << "  " << name() << " " << what << ": worst error/bound " << result.message()
                << "\n";
  }

  // Each column's sum over rows of a row-major [rows, columns] matrix, in double.
  static std::vector<float> double_column_sums(const std::vector<float>& x, int rows, int columns) {
    std::vector<double> totals(columns, 0.0);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < columns; ++c) totals[c] += x[size_t(r) * columns + c];
    }
    return std::vector<float>(totals.begin(), totals.end());
  }

  // LayerNorm forward and backward, both ways of writing dinp, against the CPU at one
  // [rows, channels] shape.
  void check_layernorm(int N, int C, const std::string& shape_label) {
    const auto inp = rounded(random_floats(size_t(N) * C, 20, -3.0f, 5.0f));
    // In 16 bits the GPU reads the parameters' 16-bit copy, the CPU the same rounded values.
    const auto master_weight = random_floats(C, 21, 0.5f, 1.5f), master_bias = random_floats(C, 22);
    const auto weight = rounded(master_weight), bias = rounded(master_bias);
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    float *d_out = poisoned_activation(out.size()), *d_mean = poisoned(N), *d_rstd = poisoned(N);
    const float *d_inp = activation(inp), *d_weight = parameters(master_weight), *d_bias = parameters(master_bias);
    cpu_.layernorm_forward({.out = out.data(), .mean = mean.data(), .rstd = rstd.data(),
                            .inp = inp.data(), .weight = weight.data(), .bias = bias.data(),
                            .rows = N, .channels = C});
    gpu_->layernorm_forward({.out = d_out, .mean = d_mean, .rstd = d_rstd, .inp = d_inp,
                             .weight = d_weight, .bias = d_bias, .rows = N, .channels = C});
    expect_close("layernorm out" + shape_label, d_out, out, tol_.rounding);
    expect_close("layernorm mean" + shape_label, d_mean, mean, kRowStatistics);
    expect_close("layernorm rstd" + shape_label, d_rstd, rstd, kRowStatistics);

    // The backward reads the CPU's mean and rstd on both sides: one op at a time.
    const auto dout = rounded(random_floats(inp.size(), 23));
    for (GradientWrite write : kGradientWrites) {
      const std::string label = shape_label + write_label(write);
      auto dinp = rounded(random_floats(inp.size(), 24));
      auto dweight = random_floats(C, 25), dbias = random_floats(C, 26);
      float* d_dinp =
          write == GradientWrite::accumulate ? activation(dinp) : poisoned_activation(dinp.size());
      float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
      cpu_.layernorm_backward({.dinp = dinp.data(), .dweight = dweight.data(),
                               .dbias = dbias.data(), .dout = dout.data(), .inp = inp.data(),
                               .weight = weight.data(), .mean = mean.data(), .rstd = rstd.data(),
                               .rows = N, .channels = C, .dinp_write = write});
      gpu_->layernorm_backward({.dinp = d_dinp, .dweight = d_dweight, .dbias = d_dbias,
                                .dout = activation(dout), .inp = d_inp, .weight = d_weight,
                                .mean = upload(mean), .rstd = upload(rstd), .rows = N,
                                .channels = C, .dinp_write = write});
      expect_close("layernorm dinp" + label, d_dinp, dinp, tol_.rounding);
      expect_close("layernorm dweight" + label, d_dweight, dweight, kColumnSum);
      expect_close("layernorm dbias" + label, d_dbias, dbias, kColumnSum);
    }
  }

  // The cross-entropy forward and backward (out of place and in place) against the CPU
  // on [N, V] logits; in 16 bits also the fused forward and backward.
  void check_cross_entropy(int N, int V, const std::string& label) {
    const auto logits = rounded(random_floats(size_t(N) * V, 70, -6.0f, 6.0f));
    const auto targets = random_ids(N, 71, V);
    std::vector<float> losses(N), row_stats(2 * size_t(N));
    float *d_losses = poisoned_statistics(N), *d_stats = poisoned_statistics(row_stats.size());
    float* d_logits = activation(logits);
    const int32_t* d_targets = upload(targets);
    cpu_.softmax_cross_entropy_forward(losses.data(), row_stats.data(), logits.data(), targets.data(), N, V);
    gpu_->softmax_cross_entropy_forward(d_losses, d_stats, d_logits, d_targets, N, V);
    expect_close("cross-entropy losses" + label, d_losses, losses, kSoftmax);
    expect_close("cross-entropy row max and 1/sum" + label, d_stats, row_stats, kSoftmax);

    // The backward overwrites (the poison must go) and recomputes the softmax with expf:
    // in fp32 from the CPU's statistics, in 16 bits from the GPU's, the gradient computed
    // in fp32 from the stored logits and rounded once (the nearest or the neighbouring
    // 16-bit value of the CPU's, as for a probability).
    const float* backward_stats = half() ? d_stats : upload(row_stats);
    const float loss_scale = 1.0f / static_cast<float>(N);
    std::vector<float> dlogits(logits.size());
    float* d_dlogits = poisoned_activation(logits.size());
    cpu_.softmax_cross_entropy_backward(dlogits.data(), logits.data(), row_stats.data(), targets.data(), N, V,
                                        loss_scale);
    gpu_->softmax_cross_entropy_backward(d_dlogits, d_logits, backward_stats, d_targets, N, V, loss_scale);
    expect_close("cross-entropy dlogits" + label, d_dlogits, dlogits, tol_.probability);
    // In place, as the classifier runs it: the very same bits.
    gpu_->softmax_cross_entropy_backward(d_logits, d_logits, backward_stats, d_targets, N, V, loss_scale);
    expect_close("cross-entropy dlogits in place" + label, d_logits, download(d_dlogits, logits.size()), kBitExact);
    if (half()) check_fused_cross_entropy(logits, targets, losses, row_stats, dlogits, label);
  }

  // The forward and the backward in one kernel, in place on [N, V] rows at every
  // alignment: the statistics within the forward's bounds of the CPU's, and dlogits bit
  // for bit the backward kernel's from the statistics the fused kernel wrote. 16 bits only.
  void check_fused_cross_entropy(const std::vector<float>& logits, const std::vector<int32_t>& targets,
                                 const std::vector<float>& losses, const std::vector<float>& row_stats,
                                 const std::vector<float>& dlogits, const std::string& label) {
    const int N = static_cast<int>(targets.size()), V = static_cast<int>(logits.size() / targets.size());
    const float loss_scale = 1.0f / static_cast<float>(N);
    const int32_t* d_targets = upload(targets);
    float* d_fused = activation(logits);
    float *d_fused_losses = poisoned_statistics(N), *d_fused_stats = poisoned_statistics(row_stats.size());
    cudaStream_t stream = nullptr;
    CHECK_CUBLAS(cublasGetStream(gpu_->cublas_handle(), &stream));
    if (precision_ == Precision::fp16)
      cuda::launch_softmax_cross_entropy_forward_backward(stream, d_fused_losses, d_fused_stats,
                                                          reinterpret_cast<__half*>(d_fused),
                                                          {d_targets, N, V, V}, loss_scale);
    else
      cuda::launch_softmax_cross_entropy_forward_backward(stream, d_fused_losses, d_fused_stats,
                                                          reinterpret_cast<__nv_bfloat16*>(d_fused),
                                                          {d_targets, N, V, V}, loss_scale);
    expect_close("fused cross-entropy losses" + label, d_fused_losses, losses, kSoftmax);
    expect_close("fused cross-entropy row max and 1/sum" + label, d_fused_stats, row_stats, kSoftmax);
    float* d_from_fused_stats = poisoned_activation(logits.size());
    gpu_->softmax_cross_entropy_backward(d_from_fused_stats, activation(logits), d_fused_stats, d_targets, N,
                                         V, loss_scale);
    expect_close("fused cross-entropy dlogits vs the backward kernel's" + label, d_fused,
                 download(d_from_fused_stats, logits.size()), kBitExact);
    expect_close("fused cross-entropy dlogits" + label, d_fused, dlogits, tol_.probability);
  }

  // The residual stream's add in the dense layer (MatmulForwardArgs::residual), against the
  // CPU's out = residual + (inp @ weight^T + bias) on the same operands. In 16 bits the
  // GEMM's error is bounded as for the plain out, relative to the layer's scale, and the sum
  // adds one rounding (u relative to it, rtol); where the GEMM cannot add the residual in its
  // epilogue, a separate add rounds the layer first (u of max|out|, within the atol's 2.56u
  // of the terms' scale). In fp32 the sum adds one fp32 rounding to kDotProduct's.
  void check_matmul_residual(const DenseCase& c, MatmulForwardArgs<float> cpu_args,
                             MatmulForwardArgs<float> gpu_args) {
    const size_t elems = size_t(cpu_args.rows) * c.out_channels;
    const std::vector<float> layer(cpu_args.out, cpu_args.out + elems);
    const auto residual = rounded(random_floats(elems, 32));
    std::vector<float> out(elems);
    cpu_args.out = out.data();
    cpu_args.residual = residual.data();
    cpu_.matmul_forward(cpu_args);
    gpu_args.out = poisoned_activation(elems);
    gpu_args.residual = activation(residual);
    gpu_->matmul_forward(gpu_args);
    const Tolerance tolerance =
        half() ? Tolerance{tol_.gemm_scaled_atol * (max_abs(layer) + max_abs(residual)), tol_.gemm_rtol}
               : kDotProduct;
    expect_close("matmul out + residual" + c.label(), gpu_args.out, out, tolerance);
  }

  // One dense layer against the CPU at N rows: the forward with its bias, without and with
  // a residual, then the backward both ways it writes its input gradient. The parameter gradients start from a random
  // prior that the GPU must add to.
  void check_matmul(const DenseCase& c, int N) {
    const std::string label = c.label();
    // The weight sits 8 elements into the parameters (as the model's weights sit at
    // offsets), the bias after it; both are fp32 masters of values the storage holds.
    const size_t weight_elems = size_t(c.out_channels) * c.in_channels;
    const size_t weight_at = 8, bias_at = weight_at + weight_elems;
    const auto params = rounded(random_floats(bias_at + c.out_channels, 31));
    float* d_params = upload(params, MemoryKind::parameters);
    gpu_->parameters_changed(d_params, 0, params.size());
    const float* weight = params.data() + weight_at;
    const float* bias = c.bias ? params.data() + bias_at : nullptr;
    const float* d_bias = c.bias ? d_params + bias_at : nullptr;

    const auto inp = rounded(random_floats(size_t(N) * c.in_channels, 30));
    std::vector<float> out(size_t(N) * c.out_channels);
    float* d_out = poisoned_activation(out.size());
    const float* d_inp = activation(inp);
    const MatmulForwardArgs<float> cpu_args{.out = out.data(), .inp = inp.data(), .weight = weight,
                                            .bias = bias, .rows = N, .in_channels = c.in_channels,
                                            .out_channels = c.out_channels};
    cpu_.matmul_forward(cpu_args);
    const MatmulForwardArgs<float> gpu_args{.out = d_out, .inp = d_inp, .weight = d_params + weight_at,
                                            .bias = d_bias, .rows = N, .in_channels = c.in_channels,
                                            .out_channels = c.out_channels};
    gpu_->matmul_forward(gpu_args);
    expect_close("matmul out" + label, d_out, out, gemm_tolerance(out));
    check_matmul_residual(c, cpu_args, gpu_args);

    const auto dout = rounded(random_floats(out.size(), 33));
    for (GradientWrite write : kGradientWrites) {
      const std::string labels = label + write_label(write);
      auto dinp = rounded(random_floats(inp.size(), 34));
      auto dweight = random_floats(weight_elems, 35), dbias = random_floats(c.out_channels, 36);
      float* d_dinp =
          write == GradientWrite::accumulate ? activation(dinp) : poisoned_activation(dinp.size());
      float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
      cpu_.matmul_backward({.dinp = dinp.data(), .dweight = dweight.data(),
                            .dbias = c.bias ? dbias.data() : nullptr, .dout = dout.data(),
                            .inp = inp.data(), .weight = weight, .rows = N,
                            .in_channels = c.in_channels, .out_channels = c.out_channels,
                            .dinp_write = write});
      gpu_->matmul_backward({.dinp = d_dinp, .dweight = d_dweight,
                             .dbias = c.bias ? d_dbias : nullptr, .dout = activation(dout),
                             .inp = d_inp, .weight = d_params + weight_at, .rows = N,
                             .in_channels = c.in_channels, .out_channels = c.out_channels,
                             .dinp_write = write});
      expect_close("matmul dinp" + labels, d_dinp, dinp, gemm_tolerance(dinp));
      expect_close("matmul dweight" + labels, d_dweight, dweight, kDotProduct);
      // Without a bias the dbias buffer must be left alone.
      expect_close("matmul dbias" + labels, d_dbias, dbias, kColumnSum);
    }
  }

  // GPT-2's MLP, C -> 4C -> C on N rows, through the dense-GELU pair against the CPU's (its
  // defaults, the plain ops): the forward of the first layer, and the second layer's
  // backward through the GELU. Weights sit at offsets in the parameters, as the model's do,
  // scaled by 1/sqrt(fan-in) so that the GELU's input spreads over its curved part (about
  // [-3, 3]) rather than its linear tails. Everything the ops write starts as NaN, the
  // parameter gradients from a random prior. Returns how many of the two calls ran a GELU
  // epilogue. 16 bits only.
  // With out_stride, the GPU's GELU output (and so the act its backward reads) is in
  // augmented rows: the values must be the CPU's and every row's columns (1, 0, ...).
  size_t check_dense_gelu(int N, int C, const std::string& label, int out_stride = 0) {
    const int H = 4 * C;
    const size_t act_row_elems = size_t(row_stride(out_stride, H));
    const size_t fc_weight_at = 8, fc_bias_at = fc_weight_at + size_t(H) * C;
    const size_t proj_weight_at = fc_bias_at + H, proj_bias_at = proj_weight_at + size_t(C) * H;
    std::vector<float> params(proj_bias_at + C, 0.0f);
    auto fill = [&](size_t at, size_t elems, uint64_t seed, float bound) {
      const auto values = rounded(random_floats(elems, seed, -bound, bound));
      std::copy(values.begin(), values.end(), params.begin() + at);
    };
    fill(fc_weight_at, size_t(H) * C, 80, 2.0f / std::sqrt(float(C)));
    fill(fc_bias_at, H, 81, 0.5f);
    fill(proj_weight_at, size_t(C) * H, 82, 2.0f / std::sqrt(float(H)));
    fill(proj_bias_at, C, 83, 0.5f);
    float* d_params = upload(params, MemoryKind::parameters);
    gpu_->parameters_changed(d_params, 0, params.size());
    const size_t before = gpu_->gelu_epilogue_gemms();

    const auto inp = rounded(random_floats(size_t(N) * C, 84));
    std::vector<float> pre(size_t(N) * H), out(pre.size());
    float *d_pre = poisoned_activation(pre.size()), *d_out = poisoned_activation(N * act_row_elems);
    cpu_.dense_gelu_forward({.pre = pre.data(), .out = out.data(), .inp = inp.data(),
                             .weight = params.data() + fc_weight_at,
                             .bias = params.data() + fc_bias_at, .rows = N, .in_channels = C,
                             .out_channels = H});
    gpu_->dense_gelu_forward({.pre = d_pre, .out = d_out, .inp = activation(inp),
                              .weight = d_params + fc_weight_at, .bias = d_params + fc_bias_at,
                              .rows = N, .in_channels = C, .out_channels = H,
                              .out_stride = out_stride});
    expect_close("dense gelu pre" + label, d_pre, pre, gemm_tolerance(pre));
    const auto out_rows = download(d_out, N * act_row_elems);
    std::vector<float> out_values(pre.size());
    size_t wrong_augmented_columns = 0;
    for (int n = 0; n < N; ++n) {
      std::copy_n(out_rows.begin() + n * act_row_elems, H, out_values.begin() + size_t(n) * H);
      for (size_t k = H; k < act_row_elems && k < size_t(H) + kAugmentedColumns; ++k)
        wrong_augmented_columns += out_rows[n * act_row_elems + k] != (k == size_t(H) ? 1.0f : 0.0f);
    }
    EXPECT_EQ(wrong_augmented_columns, 0u) << "dense gelu out" << label << ": the columns after each row";
    EXPECT_TRUE(all_close("dense gelu out" + label, out_values, out, gelu_of_gemm_tolerance(pre)));

    // Both sides go backward from the same 16-bit pre and act = gelu(pre).
    const auto pre_stored = rounded(pre);
    std::vector<float> act(pre.size());
    cpu_.gelu_forward(act.data(), pre_stored.data(), act.size());
    act = rounded(act);
    const auto dout = rounded(random_floats(size_t(N) * C, 85));
    const float* proj_weight = params.data() + proj_weight_at;
    // The gradient of act that the GELU's derivative multiplies, for the tolerance's scale.
    std::vector<float> dact(act.size()), unused_dweight(size_t(C) * H);
    cpu_.matmul_backward({.dinp = dact.data(), .dweight = unused_dweight.data(), .dbias = nullptr,
                          .dout = dout.data(), .inp = act.data(), .weight = proj_weight, .rows = N,
                          .in_channels = H, .out_channels = C,
                          .dinp_write = GradientWrite::overwrite});
    std::vector<float> dpre(pre.size()), scratch(pre.size());
    auto dweight = random_floats(size_t(C) * H, 86), dbias = random_floats(C, 87);
    // The GPU's act in its forward's layout: the CPU's values, each row augmented.
    std::vector<float> act_rows(N * act_row_elems, 0.0f);
    for (int n = 0; n < N; ++n) {
      std::copy_n(act.begin() + size_t(n) * H, H, act_rows.begin() + n * act_row_elems);
      if (out_stride != 0) act_rows[n * act_row_elems + H] = 1.0f;
    }
    float *d_dpre = poisoned_activation(pre.size()), *d_scratch = poisoned_activation(pre.size());
    float *d_dweight = upload(dweight), *d_dbias = upload(dbias);
    cpu_.dense_backward_through_gelu({.dpre = dpre.data(), .dweight = dweight.data(),
                                      .dbias = dbias.data(), .dout = dout.data(), .act = act.data(),
                                      .pre = pre_stored.data(), .weight = proj_weight, .rows = N,
                                      .in_channels = H, .out_channels = C,
                                      .dact_scratch = scratch.data()});
    gpu_->dense_backward_through_gelu({.dpre = d_dpre, .dweight = d_dweight, .dbias = d_dbias,
                                       .dout = activation(dout), .act = activation(act_rows),
                                       .pre = activation(pre_stored),
                                       .weight = d_params + proj_weight_at, .rows = N,
                                       .in_channels = H, .out_channels = C,
                                       .dact_scratch = d_scratch, .act_stride = out_stride});
    expect_close("dense gelu dpre" + label, d_dpre, dpre, gelu_of_gemm_tolerance(dact));
    expect_close("dense gelu dweight" + label, d_dweight, dweight, kDotProduct);
    expect_close("dense gelu dbias" + label, d_dbias, dbias, kColumnSum);
    return gpu_->gelu_epilogue_gemms() - before;
  }

  const PrecisionTolerances& tol_;
};

class CudaOpsBf16 : public CudaOpsTest {
 protected:
  CudaOpsBf16() : CudaOpsTest(Precision::bf16) {}
};

// Tests in every precision (CudaOpsPrecision) or in the 16-bit ones (CudaOpsHalf).
// WithParamInterface comes first so that GetParam() is usable in the constructor.
class CudaOpsPrecision : public ::testing::WithParamInterface<Precision>, public CudaOpsTest {
 protected:
  CudaOpsPrecision() : CudaOpsTest(GetParam()) {}
};
class CudaOpsHalf : public CudaOpsPrecision {};

// The op shapes' tests, in every precision (CudaOpsShapes) or in the 16-bit ones only
// (CudaOpsHalfShapes).
class CudaOpsShapes : public ::testing::WithParamInterface<std::tuple<Precision, OpShape>>,
                      public CudaOpsTest {
 protected:
  CudaOpsShapes() : CudaOpsTest(std::get<0>(GetParam())) {}
  OpShape shape() const { return std::get<1>(GetParam()); }
};
class CudaOpsHalfShapes : public CudaOpsShapes {};

constexpr Precision kPrecisions[] = {Precision::fp32, Precision::bf16, Precision::fp16};
constexpr Precision kHalfPrecisions[] = {Precision::bf16, Precision::fp16};

// CudaOpsPrecision's and CudaOpsHalf's test names: the storage (fp32, bf16, fp16).
inline std::string precision_test_name(const ::testing::TestParamInfo<Precision>& info) {
  return precision_name(info.param);
}

// The shape tests' names: the storage, then the shape (fp32_medium, bf16_odd).
inline std::string shape_test_name(
    const ::testing::TestParamInfo<std::tuple<Precision, OpShape>>& info) {
  return std::string(precision_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

// Runs a file's CudaOpsShapes tests in every precision at every op shape
// (CudaOpsShapes.Matmul/fp32_odd), its CudaOpsHalfShapes tests in bf16 and fp16
// (CudaOpsHalfShapes.DenseGelu/bf16_odd), its CudaOpsPrecision tests in every precision
// and its CudaOpsHalf tests in bf16 and fp16 (CudaOpsHalf.LayerNormAtModelWidths/fp16).
#define SCALESTUDY_SHAPE_TESTS()                                                           \
  INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsShapes,                                         \
                           ::testing::Combine(::testing::ValuesIn(kPrecisions),           \
                                              ::testing::ValuesIn(kShapes)),              \
                           shape_test_name)
#define SCALESTUDY_HALF_SHAPE_TESTS()                                                      \
  INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsHalfShapes,                                     \
                           ::testing::Combine(::testing::ValuesIn(kHalfPrecisions),       \
                                              ::testing::ValuesIn(kShapes)),              \
                           shape_test_name)
#define SCALESTUDY_PRECISION_TESTS()                                                          \
  INSTANTIATE_TEST_SUITE_P(Precisions, CudaOpsPrecision, ::testing::ValuesIn(kPrecisions), \
                           precision_test_name)
#define SCALESTUDY_HALF_PRECISION_TESTS()                                                    \
  INSTANTIATE_TEST_SUITE_P(Precisions, CudaOpsHalf, ::testing::ValuesIn(kHalfPrecisions), \
                           precision_test_name)

}  // namespace scalestudy::gpu_test
