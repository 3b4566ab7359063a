#pragma once
// The CUDA backend: kernels from kernels/ and cuBLAS GEMMs (CUBLAS_COMPUTE_32F, no TF32),
// all issued on one non-blocking compute stream that the cuBLAS handle is bound to. Ops
// return as soon as their work is queued, except those that hand data to the host
// (copy_to_host, copy_from_host, sum, sum_of_squares), which synchronise the stream so
// that their host buffers are safe to read or reuse on return.
//
// Every reduction is deterministic (fixed partitions and combination orders, no
// atomics), so the same inputs give the same bits on every run.
//
// Precision::fp32: everything is fp32. Elementwise ops round as the CPU reference does;
// the GPU-vs-CPU differences that remain come from reduction order, cuBLAS's dot-product
// order, and expf/tanhf (within 2 ulp of glibc's).
//
// Precision::bf16 and Precision::fp16 (mixed precision, fp32 master weights) work alike;
// they differ only in the 16-bit storage type, __nv_bfloat16 or __half ("16-bit" below
// means that type):
// - Every MemoryKind::activations buffer from allocate_floats holds 16-bit values behind
//   its float* handle (elems * 2 bytes). Handles are opaque: only the pointer returned by
//   allocate_floats may be passed (an offset into 16-bit storage is rejected).
//   allocate_statistics buffers (LayerNorm mean/rstd, losses) and every other kind
//   (parameters, gradients, optimizer state, communication) stay fp32.
// - Ops follow the storage of their activation operands, found from the allocation
//   registry: all 16-bit runs the kernels instantiated for the precision's type (fp32
//   arithmetic, one rounding per stored result), all fp32 runs the fp32 ones, and a mix is
//   an error. fill_zero, copy, copy_to_host and copy_from_host convert between 16-bit
//   storage and fp32 values (on the host with half_host.h's conversions, which round as
//   the device does).
// - The MemoryKind::parameters allocation gets a 16-bit copy of the same length. Every op
//   that reads a parameter (GEMM weights and biases, embedding tables, LayerNorm weights
//   and biases) reads it from the copy, at the parameter's offset: forward and backward
//   see the rounded parameters only, and the fp32 masters are the optimizer's. So a
//   strategy that moves parameters between ranks moves the copy (compute_copy_of); zero2
//   gathers 16 bits a parameter. The copy is refreshed by parameters_changed(), by the
//   fused AdamW, or by such a gather; until the first refresh it holds NaN, so a
//   forgotten one shows up as a NaN loss rather than as silently stale weights.
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

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "backend/backend.h"
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

class CudaOps final : public Backend {
 public:
  // Makes `device` current for the calling thread and creates the stream and handle.
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
  int device() const { return device_; }
  Precision precision() const { return precision_; }
  // The fused attention of the 16-bit modes: flash or cudnn (auto resolved).
  AttentionKernel attention_kernel() const { return attention_kernel_; }
  // The compute stream: every op of this backend runs on it, in issue order.
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas_handle() const { return cublas_; }

  // ---- DeviceMemory -----------------------------------------------------------------
  float* allocate_floats(size_t elems, MemoryKind kind) override;
  float* allocate_statistics(size_t elems) override;
  int32_t* allocate_ints(size_t elems, MemoryKind kind) override;
  // 2 bytes an element for activations in bf16/fp16, 4 + 2 for parameters there (their
  // 16-bit copy), else 4.
  size_t floats_bytes(size_t elems, MemoryKind kind) const override;
  float* activation_at(float* activations, size_t elems) const override;
  void release(void* ptr) override;
  void fill_zero(float* dst, size_t elems) override;
  void copy(float* dst, const float* src, size_t elems) override;
  void copy_to_host(float* host_dst, const float* src, size_t elems) override;
  void copy_from_host(float* dst, const float* host_src, size_t elems) override;
  void copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) override;
  // The device's free memory (cudaMemGetInfo).
  size_t available_bytes() const override;
  // Includes the backend's own scratch buffers, under MemoryKind::other.
  size_t allocated_bytes(MemoryKind kind) const override;
  // The largest device-wide use (total - free, from cudaMemGetInfo) seen at any of this
  // backend's allocations, releases or peak queries. Device-wide: it includes the CUDA
  // context, cuBLAS and NCCL buffers, and anything else on the GPU (one rank per GPU).
  size_t measured_peak_bytes() const override;
  std::string peak_source() const override { return "cudaMemGetInfo"; }

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

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                      int rows, int in_channels, int out_channels) override;
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

  void residual_forward(float* out, const float* a, const float* b, size_t elems) override;
  void residual_layernorm_forward(const ResidualLayerNormForwardArgs<float>& args) override;
  void accumulate(float* dst, const float* src, size_t elems) override;

  void softmax_cross_entropy_forward(float* losses, float* row_stats, const float* logits,
                                     const int32_t* targets, int rows, int vocab) override;
  void softmax_cross_entropy_backward(float* dlogits, const float* logits,
                                      const float* row_stats, const int32_t* targets, int rows,
                                      int vocab, float loss_scale) override;
  // In bf16/fp16 the logits' rows are padded to a multiple of 64 elements
  // (cuda::padded_logits_row_elems), so that the LM head's GEMMs read and write them in
  // place, each row from the start of a 128-byte line; in fp32 they are the plain [N,V] of
  // the default.
  float* allocate_logits(int rows, int vocab) override;
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

  // bf16 / fp16: casts the range into the parameters' 16-bit copy, on the compute stream
  // (in fp16, masters beyond 65504 become +-inf there).
  void parameters_changed(const float* params, size_t begin_elems, size_t end_elems) override;
  uint16_t* compute_copy_of(float* params) override;

  // The largest scratch request of the model's ops, grown as scratch_floats grows it.
  size_t model_scratch_bytes(const ModelShape& shape, int batch, int seq) const override;

 private:
  struct Allocation {
    size_t bytes = 0;
    MemoryKind kind = MemoryKind::other;
    bool half = false;                // the storage behind the float* handle is 16-bit
    void* parameter_copy = nullptr;   // 16-bit modes, parameters: the 16-bit copy
    size_t parameter_copy_bytes = 0;
    int logits_row_elems = 0;         // 16-bit modes, allocate_logits: the padded row
  };
  // What the registry knows about a pointer: the allocation that contains it, if any.
  struct Lookup {
    bool found = false;
    uintptr_t base = 0;
    Allocation allocation;
  };
  // The padded row stride of a 16-bit logits buffer from allocate_logits (checked against
  // rows and vocab), or 0 for any other buffer.
  int padded_logits_stride(const float* logits, int rows, int vocab) const;
  // The classifier's backward reads logits rows this many elements apart.
  int classifier_logits_stride(const float* logits, int rows, int vocab) const;
  // An activation operand of an op, for the storage check.
  struct Operand {
    const void* ptr;
    const char* what;
  };

  // bf16 or fp16: activations and the parameters' copy are 16-bit.
  bool half_mode() const { return precision_ == Precision::bf16 || precision_ == Precision::fp16; }
  // The name of the mode, for messages: "bf16" or "fp16" (or "fp32").
  const char* mode_name() const { return precision_name(precision_); }
  // cudaMalloc on this backend's device. Out of memory throws OutOfMemoryError; any other
  // failure aborts with a report.
  void* device_malloc(size_t bytes, MemoryKind kind);
  void* allocate_bytes(size_t bytes, MemoryKind kind, bool half = false);
  Lookup find_allocation(const void* ptr) const;
  // Whether ptr's storage is 16-bit. Always false in fp32 mode; in the 16-bit modes an
  // offset into 16-bit storage is an error unless activation_at gave it.
  bool stores_half(const void* ptr, const char* what) const;
  // Whether ptr is a handle activation_at gave out.
  bool is_activation_view(const void* ptr) const;
  // Whether the (non-null) operands of `op` are all 16-bit; a mix aborts.
  bool half_operands(const char* op, std::initializer_list<Operand> operands) const;
  // Whether allocate_attention_state keeps the fused kernels' log-sum-exp for `shape`
  // (bf16/fp16, where they take the shape) rather than the probabilities.
  bool keeps_log_sum_exp(const AttentionShape& shape) const;
  // Whether an attention state is the fused kernels' (bf16/fp16, an fp32 buffer).
  bool fused_attention_state(const float* state, const AttentionShape& shape) const;
  // Whether the attention of `shape` runs through cuDNN (--attention-kernel cudnn, a shape
  // it takes); the other fused shapes run through the flash kernels.
  bool uses_cudnn_attention(const AttentionShape& shape) const;
  void cudnn_attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& shape);
  void cudnn_attention_backward(const AttentionBackwardArgs<float>& args);
  // Aborts when ptr is 16-bit storage: statistics, losses, gradients and optimizer state.
  void require_fp32(const void* ptr, const char* what) const;
  void require_fp32(std::initializer_list<Operand> operands) const;
  // The 16-bit copy of the parameter `weight` points at.
  const void* parameter_copy_of(const float* weight) const;
  // The parameter as ops whose activations are of storage T read it: the fp32 master
  // itself, or in bf16 and fp16 its 16-bit copy.
  template <class T>
  const T* parameter_as(const float* param) const {
    if constexpr (std::is_same_v<T, float>) {
      return param;
    } else {
      return static_cast<const T*>(parameter_copy_of(param));
    }
  }
  // The same, or nullptr where `param` is not in the parameters allocation.
  const void* parameter_copy_or_null(const float* param) const;
  void copy_host_to_device(void* dst, const void* host_src, size_t bytes);
  // A device buffer of at least `elems` floats, shared by every op that needs scratch:
  // ops run in stream order, so one op's use ends before the next op's begins. Grows
  // (after a stream synchronisation) and never shrinks.
  float* scratch_floats(size_t elems);
  // The same scratch as a launcher takes it: at least `elems` floats, and how many.
  cuda::Scratch scratch_of(size_t elems);
  double read_device_double();
  // Updates peak_used_bytes_ from cudaMemGetInfo.
  void sample_device_usage() const;

  int device_ = 0;
  int multiprocessors_ = 0;        // the device's
  int multiprocessor_target_ = 0;  // the GEMMs' (0: all of them)
  Precision precision_ = Precision::fp32;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  // 16-bit modes: the dense layers' GEMMs with the bias, or the GELU, in cuBLASLt's
  // epilogue, and the plain GEMMs a chooser names algorithms for.
  std::unique_ptr<cuda::LtGemm> lt_gemm_;
  // The cuBLAS handle and, where a chooser names algorithms for plain GEMMs, lt_gemm_.
  cuda::Blas blas() const;
  size_t gelu_epilogue_gemms_ = 0;
  AttentionKernel attention_kernel_ = AttentionKernel::flash;
  // With --attention-kernel cudnn: the cuDNN handle and the graphs built so far.
  std::unique_ptr<CudnnAttention> cudnn_attention_;

  // Scratch grows by at least this factor, so a sequence of slightly larger requests
  // does not reallocate (and synchronise) every time.
  static constexpr double kScratchGrowth = 1.5;
  float* scratch_ = nullptr;
  size_t scratch_elems_ = 0;
  // Partials and result of sum / sum_of_squares, and the pinned word the result is
  // read back through.
  double* reduction_partials_ = nullptr;
  size_t reduction_partials_elems_ = 0;
  double* device_result_ = nullptr;
  double* host_result_ = nullptr;
  // Token ids travel through pinned staging, so that their copy neither waits for the
  // stream nor makes it wait for the host. A slot is refilled kPinnedSlots copies later,
  // once its last copy has passed (`copied`): a step's tokens and targets take two.
  struct PinnedSlot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };
  static constexpr int kPinnedSlots = 4;
  std::array<PinnedSlot, kPinnedSlots> pinned_slots_{};
  int next_pinned_slot_ = 0;
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

  // The comm thread may allocate or release staging buffers while the compute thread
  // does the same.
  mutable std::mutex memory_mutex_;
  // Ordered by address, so that a pointer into an allocation finds it.
  std::map<uintptr_t, Allocation> allocations_;
  // Handles inside an allocation that activation_at gave out: ops take them as they take a
  // base, where any other pointer inside a 16-bit buffer is a caller's offset on float*.
  mutable std::set<uintptr_t> activation_views_;
  std::array<size_t, kMemoryKindCount> bytes_by_kind_{};
  mutable size_t peak_used_bytes_ = 0;
};

}  // namespace scalestudy
