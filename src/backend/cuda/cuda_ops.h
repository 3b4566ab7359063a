#pragma once
// The CUDA backend: kernels from kernels/ and cuBLAS GEMMs (CUBLAS_COMPUTE_32F, no TF32),
// on the memory of CudaMemory, all issued on its non-blocking compute stream, which the
// cuBLAS handle is bound to. The ops (Ops) and the device's services (DeviceServices) are
// here; the layer ops are in cuda_layer_ops.cpp, the GEMM ops in cuda_gemm_ops.cpp. Ops
// return as soon as their work is queued, except those that hand a result to the host
// (sum, sum_of_squares), which synchronise the stream.
//
// Every reduction is deterministic (fixed partitions and combination orders, no
// atomics), so the same inputs give the same bits on every run.
//
// Precision::fp32: everything is fp32. Elementwise ops round as the CPU reference does;
// the GPU-vs-CPU differences that remain come from reduction order, cuBLAS's dot-product
// order, and expf/tanhf (within 2 ulp of glibc's).
//
// Precision::bf16 and Precision::fp16 (mixed precision, fp32 master weights): activations
// are 16-bit and parameters are read from their 16-bit copy (cuda_memory.h says how each
// buffer is stored), and ops run the kernels of the storage of their operands:
// - GEMMs (cublasGemmEx, CUDA_R_16BF or CUDA_R_16F operands, CUBLAS_COMPUTE_32F) take
//   16-bit operands and accumulate in fp32: activations and their gradients come out
//   16-bit, weight gradients fp32 (accumulated into the fp32 gradient buffer). Attention
//   scores and their gradient stay fp32 (in scratch) between the GEMMs and the softmax
//   kernels; the cross-entropy loss comes from a log-sum-exp in fp32/double.
// - fp16 only: its range ends at 65504, and every store rounds as IEEE does, so a larger
//   result becomes +-inf - never clamped. An overflowing activation gradient therefore
//   makes the fp32 weight gradients (and their norm, sum_of_squares) non-finite, which is
//   what the trainer's dynamic loss scaling detects; small gradients underflow into fp16's
//   subnormals (below 2^-14) unless the loss scale lifts them. In fp16 the cuBLAS handle
//   also sets CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION, so that split-K partial
//   sums are reduced in fp32 rather than in fp16 (where a partial sum could overflow or
//   lose bits that the fp32 result keeps).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_memory.h"
#include "core/precision.h"
#include "scratch.cuh"

namespace scalestudy::cuda {
class GemmChooser;
class LtGemm;
struct AdamWDevicePiece;
struct Blas;
}

namespace scalestudy {

class CudnnAttention;

class CudaOps final : public CudaMemory {
 public:
  // Makes `device` current for the calling thread and creates the stream and handles.
  // gemm_algos: how the 16-bit GEMMs with a cuBLASLt epilogue pick their algorithm
  // (RunConfig's --gemm-algos); heuristic gives the same bits on every run.
  // attention_kernel: which fused attention bf16 and fp16 run (RunConfig's
  // --attention-kernel; auto is flash); cudnn opens libcudnn here and ends the job where it
  // cannot (callers that take user input check cudnn_attention_loadable first), and is
  // refused in fp32, which keeps the probabilities in memory.
  // gemm_chooser: in bf16 and fp16, what names algorithms for the GEMMs' shapes, over
  // gemm_algos and over cuBLAS's own for the plain GEMMs (--gemm-algos-file's choices;
  // null: none).
  explicit CudaOps(int device, Precision precision = Precision::fp32,
                   GemmAlgos gemm_algos = GemmAlgos::heuristic,
                   AttentionKernel attention_kernel = AttentionKernel::flash,
                   std::shared_ptr<cuda::GemmChooser> gemm_chooser = nullptr);
  ~CudaOps() override;

  std::string name() const override { return "cuda"; }
  // The fused attention of the 16-bit modes: flash or cudnn (auto resolved).
  AttentionKernel attention_kernel() const { return attention_kernel_; }
  cublasHandle_t cublas_handle() const { return cublas_; }

  // ---- DeviceServices ---------------------------------------------------------------
  bool runs_asynchronously() const override { return true; }
  void synchronize() override;
  // Events on the compute stream.
  std::unique_ptr<StepTimer> make_step_timer() override;
  // CUPTI (cupti_tracer.h), loaded by this call.
  std::unique_ptr<KernelTracer> make_kernel_tracer() override;
  std::vector<std::string> algorithm_choices() const override;
  // cuBLAS's and cuBLASLt's SM count target: GEMMs sized for the multiprocessors left.
  void reserve_multiprocessors(int count) override;

  // ---- Ops ------------------------------------------------------------------------
  void embedding_forward(const EmbeddingForwardArgs<float>& args) override;
  void embedding_backward(const EmbeddingBackwardArgs<float>& args) override;

  void layernorm_forward(const LayerNormForwardArgs<float>& args) override;
  void layernorm_backward(const LayerNormBackwardArgs<float>& args) override;

  void matmul_forward(const MatmulForwardArgs<float>& args) override;
  int dense_input_stride(int channels) const override;
  int attention_output_stride(const AttentionShape& shape) const override;
  int gelu_output_stride(int channels) const override;
  void matmul_backward(const MatmulBackwardArgs<float>& args) override;

  // bf16 with a bias among the parameters: one cuBLASLt GEMM each, the GELU in its
  // epilogue (kernels/gelu.cuh), where cuBLASLt takes the shapes; otherwise, and in
  // fp16 and fp32, the plain ops (Ops's defaults).
  void dense_gelu_forward(const DenseGeluForwardArgs<float>& args) override;
  void dense_backward_through_gelu(const DenseGeluBackwardArgs<float>& args) override;
  // GEMMs that ran with a GELU epilogue so far, forward and backward: how the GPU tests see
  // that GPT-2's shapes take the fused path rather than the plain ops.
  size_t gelu_epilogue_gemms() const { return gelu_epilogue_gemms_; }
  // Whether the dense-GELU pair may run in cuBLASLt's GELU epilogues (bf16 only).
  bool gelu_epilogues_allowed() const;

  // A `state` from allocate_attention_state in bf16/fp16 is the fused kernels' fp32
  // log-sum-exp (kernels/flash_attention.cuh, no T×T matrix); a 16-bit (or, in fp32, an
  // fp32) buffer of [B,NH,T,T] runs the cuBLAS path, which stores the probabilities.
  void attention_forward(float* out, float* state, const float* qkv,
                         const AttentionShape& shape) override;
  // The cuBLAS path overwrites as a zero fill followed by its accumulating backward.
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* state, const AttentionShape& shape,
                          GradientWrite dqkv_write) override;
  float* allocate_attention_state(const AttentionShape& shape) override;
  size_t attention_state_bytes(const AttentionShape& shape) const override;

  void gelu_forward(float* out, const float* inp, size_t elems) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems,
                     GradientWrite dinp_write) override;

  void accumulate(float* dst, const float* src, size_t elems) override;

  void softmax_cross_entropy_forward(float* losses, float* row_stats, const float* logits,
                                     const int32_t* targets, int rows, int vocab) override;
  void softmax_cross_entropy_backward(float* dlogits, const float* logits,
                                      const float* row_stats, const int32_t* targets, int rows,
                                      int vocab, float loss_scale) override;
  size_t logits_bytes(size_t rows, int vocab) const override;
  // With dlogits_scale and padded logits, one kernel computes the loss and dlogits
  // (cuda::launch_softmax_cross_entropy_forward_backward).
  void classifier_forward(const ClassifierForwardArgs<float>& args) override;
  void classifier_backward_from_dlogits(const ClassifierInputGradientArgs<float>& args) override;
  void classifier_weight_backward(const ClassifierWeightGradientArgs<float>& args) override;
  void classifier_backward(const ClassifierBackwardArgs<float>& args) override;
  double sum(const float* x, size_t elems) override;

  double sum_of_squares(const float* x, size_t elems) override;
  void scale(float* x, size_t elems, float factor) override;
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t elems,
                    const AdamWParams& hyper) override;
  // One launch for all the pieces; in bf16/fp16, where params lie in the parameters
  // allocation, the 16-bit copy of the range is written in the same pass (returns true).
  bool adamw_update_pieces(float* params, const float* grads, float* m, float* v,
                           const std::vector<AdamWPiece>& pieces,
                           const AdamWParams& hyper) override;
  // Its device table: one entry per non-empty piece.
  size_t adamw_pieces_bytes(const std::vector<AdamWPiece>& pieces) const override;

  // The largest scratch request of the model's ops, grown as scratch_floats grows it.
  size_t model_scratch_bytes(const ModelShape& shape, int batch, int seq) const override;

 private:
  // The classifier's backward reads logits rows this many elements apart.
  int classifier_logits_stride(const float* logits, int rows, int vocab) const;
  // Whether allocate_attention_state keeps the fused kernels' log-sum-exp for `shape`
  // (bf16/fp16, where they take the shape) rather than the probabilities.
  bool keeps_log_sum_exp(const AttentionShape& shape) const;
  // Whether an attention state is the fused kernels' (bf16/fp16, an fp32 buffer).
  bool fused_attention_state(const float* state, const AttentionShape& shape) const;
  // Whether the attention of `shape` runs through cuDNN (--attention-kernel cudnn, a shape
  // it takes); the other fused shapes run through the flash kernels.
  bool uses_cudnn_attention(const AttentionShape& shape) const;
  // Aborts where shape.out_stride asks for augmented rows this attention does not write.
  void check_attention_output_stride(const AttentionShape& shape) const;
  void cudnn_attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& shape);
  void cudnn_attention_backward(const AttentionBackwardArgs<float>& args);
  double read_device_double();
  // The cuBLAS handle and, where a chooser names algorithms for plain GEMMs, lt_gemm_.
  cuda::Blas blas() const;

  int multiprocessors_ = 0;        // the device's
  int multiprocessor_target_ = 0;  // the GEMMs' (0: all of them)
  cublasHandle_t cublas_ = nullptr;
  // 16-bit modes: the dense layers' GEMMs with the bias, or the GELU, in cuBLASLt's
  // epilogue, and the plain GEMMs a chooser names algorithms for.
  std::unique_ptr<cuda::LtGemm> lt_gemm_;
  size_t gelu_epilogue_gemms_ = 0;
  AttentionKernel attention_kernel_ = AttentionKernel::flash;
  // With --attention-kernel cudnn: the cuDNN handle and the graphs built so far.
  std::unique_ptr<CudnnAttention> cudnn_attention_;

  // Partials and result of sum / sum_of_squares, and the pinned word the result is
  // read back through.
  double* reduction_partials_ = nullptr;
  size_t reduction_partials_elems_ = 0;
  double* device_result_ = nullptr;
  double* host_result_ = nullptr;
  // adamw_update_pieces' piece tables on the device, each uploaded once: a strategy
  // passes the same few ranges every step.
  struct AdamWTable {
    std::vector<AdamWPiece> pieces;
    cuda::AdamWDevicePiece* device = nullptr;
    int device_pieces = 0;
    unsigned blocks = 0;
  };
  const AdamWTable& adamw_table_for(const std::vector<AdamWPiece>& pieces);
  std::vector<AdamWTable> adamw_tables_;
};

}  // namespace scalestudy
