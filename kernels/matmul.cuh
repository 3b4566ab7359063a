#pragma once
// The dense layer out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC], as a cuBLAS GEMM
// plus a bias kernel; backward as two accumulating GEMMs and a deterministic column
// reduction for the bias. In fp32 every operand is fp32. In bf16 (fp16) the activations
// and the weight and bias are bf16 (fp16) - the parameters from the backend's 16-bit copy
// of them -, and the weight and bias gradients are fp32:
// the GEMMs accumulate in fp32 and round once to their result's storage. The 16-bit
// launchers of both types share their scratch sizes (the _16bit functions).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace scalestudy::cuda {

class EpilogueGemm;

// bias may be null (the tied LM head has none). handle must be bound to stream.
void launch_matmul_forward(cublasHandle_t handle, cudaStream_t stream, float* out,
                           const float* inp, const float* weight, const float* bias, int rows,
                           int in_channels, int out_channels);
// bf16 and fp16 need scratch when out_channels is not a multiple of 8 (rows padded for
// cuBLAS's fast kernels); this many floats, possibly 0. With a bias and a bias_gemm, the
// bias is added in cuBLASLt's epilogue where the shapes allow (gemm_lt.cuh), and by a
// kernel otherwise.
size_t matmul_forward_scratch_elems_16bit(int rows, int out_channels);
// Half is __nv_bfloat16 or __half, here and below.
template <class Half>
void launch_matmul_forward(cublasHandle_t handle, cudaStream_t stream, Half* out, const Half* inp,
                           const Half* weight, const Half* bias, int rows, int in_channels,
                           int out_channels, float* scratch, size_t scratch_elems,
                           EpilogueGemm* bias_gemm);

// Floats of scratch that launch_matmul_backward needs (for the bias reduction).
size_t matmul_backward_scratch_elems(int rows, int out_channels);
// dinp += dout @ weight (accumulate_dinp) or dinp = dout @ weight (dinp not read);
// dweight += dout^T @ inp; dbias += column sums of dout (dbias may be null, and then
// nothing is reduced).
void launch_matmul_backward(cublasHandle_t handle, cudaStream_t stream, float* dinp,
                            float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int rows, int in_channels, int out_channels,
                            float* scratch, size_t scratch_elems, bool accumulate_dinp);
// Floats of scratch for the bf16 and fp16 backwards: padded rows where out_channels needs
// them, and the bias reduction.
size_t matmul_backward_scratch_elems_16bit(int rows, int out_channels);
template <class Half>
void launch_matmul_backward(cublasHandle_t handle, cudaStream_t stream, Half* dinp, float* dweight,
                            float* dbias, const Half* dout, const Half* inp, const Half* weight,
                            int rows, int in_channels, int out_channels, float* scratch,
                            size_t scratch_elems, bool accumulate_dinp);

// The parameter gradients of the 16-bit backward without its input gradient, for a
// backward that computes that elsewhere: dweight += dout^T @ inp, dbias += column sums of
// dout (dbias may be null), with out_channels a multiple of 8 and
// matmul_backward_scratch_elems(rows, out_channels) floats of scratch where dbias is given.
template <class Half>
void launch_matmul_parameter_gradients(cublasHandle_t handle, cudaStream_t stream, float* dweight,
                                       float* dbias, const Half* dout, const Half* inp, int rows,
                                       int in_channels, int out_channels, float* scratch,
                                       size_t scratch_elems);

// The tied LM head of the classifier in 16 bits, on logits whose rows are
// padded_logits_row_elems(vocab) elements apart (a multiple of 8, so that the GEMMs stay on
// cuBLAS's fast kernels without copies): logits = inp @ weight^T. The padding columns are
// never read or written.
int padded_logits_row_elems(int vocab);
// T is __nv_bfloat16 or __half.
template <class T>
void launch_classifier_matmul_forward(cublasHandle_t handle, cudaStream_t stream, T* logits,
                                      int logits_stride, const T* inp, const T* weight, int rows,
                                      int in_channels, int vocab);
// The backward in the two parts that the model runs apart, on dlogits rows logits_stride
// apart (padded_logits_row_elems(vocab) in 16 bits, vocab in fp32):
//   dinp (+)= dlogits @ weight, as accumulate_dinp says;
//   dweight's rows [vocab_begin, vocab_end) += dlogits[:, those columns]^T @ inp, with
//   dweight pointing at row 0 and vocab_begin a multiple of 8. Each element of dweight
//   comes from one GEMM whatever the range, so a range's rows do not depend on the cut.
// T is float, __nv_bfloat16 or __half.
template <class T>
void launch_classifier_input_gradient(cublasHandle_t handle, cudaStream_t stream, T* dinp,
                                      const T* dlogits, int logits_stride, const T* weight,
                                      int rows, int in_channels, int vocab, bool accumulate_dinp);
template <class T>
void launch_classifier_weight_gradient(cublasHandle_t handle, cudaStream_t stream,
                                       float* dweight, const T* dlogits, int logits_stride,
                                       const T* inp, int rows, int in_channels, int vocab,
                                       int vocab_begin, int vocab_end);

}  // namespace scalestudy::cuda
