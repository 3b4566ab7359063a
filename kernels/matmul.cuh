#pragma once
// The dense layer out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC], as a cuBLAS GEMM
// plus a bias kernel; backward as two accumulating GEMMs and a deterministic column
// reduction for the bias, or, over augmented rows (op_params.h), the bias gradient from
// the weight gradient's GEMM. In fp32 every operand is fp32. In bf16 (fp16) the activations
// and the weight and bias are bf16 (fp16) - the parameters from the backend's 16-bit copy
// of them -, and the weight and bias gradients are fp32:
// the GEMMs accumulate in fp32 and round once to their result's storage. The 16-bit
// launchers of both types share their scratch sizes (the _16bit functions).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "op_params.h"
#include "scratch.cuh"

namespace scalestudy::cuda {

class LtGemm;
struct Blas;  // gemm_lt.cuh

// A dense layer's arguments are MatmulForwardArgs and MatmulBackwardArgs
// (kernels/op_params.h); T is float, __nv_bfloat16 or __half, or void for cuBLASLt's
// untyped calls (gemm_lt.cuh).

// blas.handle must be bound to stream, for every launcher below.
void launch_matmul_forward(const Blas& blas, cudaStream_t stream,
                           const MatmulForwardArgs<float>& args);
// bf16 and fp16 need scratch when out_channels is not a multiple of 8 (rows padded for
// cuBLAS's fast kernels); this many floats, possibly 0. With a bias and a bias_gemm, the
// bias is added in cuBLASLt's epilogue where the shapes allow (gemm_lt.cuh), and by a
// kernel otherwise.
size_t matmul_forward_scratch_elems_16bit(int rows, int out_channels);
// Half is __nv_bfloat16 or __half, here and below.
template <class Half>
void launch_matmul_forward(const Blas& blas, cudaStream_t stream,
                           const MatmulForwardArgs<Half>& args, Scratch scratch,
                           LtGemm* bias_gemm);

// Floats of scratch that launch_matmul_backward needs (for the bias reduction).
size_t matmul_backward_scratch_elems(int rows, int out_channels);
// dinp += dout @ weight (GradientWrite::accumulate) or dinp = dout @ weight (overwrite:
// dinp not read); dweight += dout^T @ inp; dbias += column sums of dout (dbias may be
// null, and then nothing is reduced).
void launch_matmul_backward(const Blas& blas, cudaStream_t stream,
                            const MatmulBackwardArgs<float>& args, Scratch scratch);
// Floats of scratch for the bf16 and fp16 backwards: padded rows where out_channels needs
// them, and the bias reduction.
size_t matmul_backward_scratch_elems_16bit(int rows, int out_channels);
// Floats of scratch for a bf16 or fp16 backward over augmented rows: the weight gradient
// over [x, 1], [OC, IC + kAugmentedColumns], which the bias gradient is split from. Such a
// backward needs out_channels a multiple of 8, and reads dout once: for the GEMMs.
size_t augmented_weight_gradient_elems(int in_channels, int out_channels);
// The stride of 16-bit augmented rows of `channels`: channels + kAugmentedColumns, rounded
// up to a 128-byte line, as the logits' rows are.
int augmented_row_elems(int channels);
// Writes the augmented columns (1, then zeros) after each of `count` rows of `channels`
// values `stride` apart: for rows whose writer fills only the values (cuDNN's attention,
// cuBLASLt's epilogues).
template <class Half>
void launch_augmented_columns(cudaStream_t stream, Half* rows, int count, int channels, int stride);
template <class Half>
void launch_matmul_backward(const Blas& blas, cudaStream_t stream,
                            const MatmulBackwardArgs<Half>& args, Scratch scratch);

// The parameter gradients of the 16-bit backward without its input gradient, for a
// backward that computes that elsewhere: dweight and dbias from dout and inp (args' dinp,
// weight and dinp_write are not read), with out_channels a multiple of 8 and
// matmul_backward_scratch_elems(rows, out_channels) floats of scratch where dbias is given.
template <class Half>
void launch_matmul_parameter_gradients(const Blas& blas, cudaStream_t stream,
                                       const MatmulBackwardArgs<Half>& args, Scratch scratch);

// The tied LM head of the classifier in 16 bits, on logits whose rows are
// padded_logits_row_elems(vocab) elements apart (a multiple of 64, so that the GEMMs stay on
// cuBLAS's fast kernels without copies and every row starts on a 128-byte line): logits =
// inp @ weight^T, of args' logits, inp, weight and shape. The padding columns are never read
// or written.
int padded_logits_row_elems(int vocab);
// T is __nv_bfloat16 or __half.
template <class T>
void launch_classifier_matmul_forward(const Blas& blas, cudaStream_t stream,
                                      const ClassifierForwardArgs<T>& args, int logits_stride);
// The backward in the two parts that the model runs apart, on dlogits rows logits_stride
// apart (padded_logits_row_elems(vocab) in 16 bits, vocab in fp32); each element of
// dweight comes from one GEMM whatever the range, so a range's rows do not depend on the
// cut. T is float, __nv_bfloat16 or __half.
template <class T>
void launch_classifier_input_gradient(const Blas& blas, cudaStream_t stream,
                                      const ClassifierInputGradientArgs<T>& args,
                                      int logits_stride);
template <class T>
void launch_classifier_weight_gradient(const Blas& blas, cudaStream_t stream,
                                       const ClassifierWeightGradientArgs<T>& args,
                                       int logits_stride);

}  // namespace scalestudy::cuda
