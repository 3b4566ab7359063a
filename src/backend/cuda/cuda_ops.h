#pragma once
// The CUDA backend in fp32: kernels from kernels/ and cuBLAS SGEMMs (CUBLAS_COMPUTE_32F,
// no TF32), all issued on one non-blocking compute stream that the cuBLAS handle is
// bound to. Ops return as soon as their work is queued, except those that hand data to
// the host (copy_to_host, copy_from_host, sum, sum_of_squares), which synchronise the
// stream so that their host buffers are safe to read or reuse on return.
//
// Every reduction is deterministic (fixed partitions and combination orders, no
// atomics), so the same inputs give the same bits on every run. Elementwise ops round
// as the CPU reference does; the GPU-vs-CPU differences that remain come from reduction
// order, cuBLAS's dot-product order, and expf/tanhf (within 2 ulp of glibc's).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend/ops.h"

namespace scalestudy {

class CudaOps final : public Ops {
 public:
  // Makes `device` current for the calling thread and creates the stream and handle.
  explicit CudaOps(int device);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  std::string name() const override { return "cuda"; }
  int device() const { return device_; }
  // The compute stream: every op of this backend runs on it, in issue order.
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas_handle() const { return cublas_; }

  float* allocate_floats(size_t elems, MemoryKind kind) override;
  int32_t* allocate_ints(size_t elems, MemoryKind kind) override;
  void release(void* ptr) override;
  void fill_zero(float* dst, size_t elems) override;
  void copy(float* dst, const float* src, size_t elems) override;
  void copy_to_host(float* host_dst, const float* src, size_t elems) override;
  void copy_from_host(float* dst, const float* host_src, size_t elems) override;
  void copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) override;
  // Includes the backend's own scratch buffers, under MemoryKind::other.
  size_t allocated_bytes(MemoryKind kind) const override;
  // The largest device-wide use (total - free, from cudaMemGetInfo) seen at any of this
  // backend's allocations, releases or peak queries. Device-wide: it includes the CUDA
  // context, cuBLAS and NCCL buffers, and anything else on the GPU (one rank per GPU).
  size_t measured_peak_bytes() const override;
  std::string peak_source() const override { return "cudaMemGetInfo"; }

  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int batch, int seq, int channels) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int batch, int seq, int channels) override;

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int rows,
                         int channels) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int rows, int channels) override;

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                      int rows, int in_channels, int out_channels) override;
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int rows, int in_channels,
                       int out_channels) override;

  void attention_forward(float* out, float* probs, const float* qkv,
                         const AttentionShape& shape) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                          const AttentionShape& shape) override;

  void gelu_forward(float* out, const float* inp, size_t elems) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems) override;

  void residual_forward(float* out, const float* a, const float* b, size_t elems) override;
  void accumulate(float* dst, const float* src, size_t elems) override;

  void softmax_cross_entropy_forward(float* losses, float* probs, const float* logits,
                                     const int32_t* targets, int rows, int vocab) override;
  void softmax_cross_entropy_backward(float* dlogits, const float* probs,
                                      const int32_t* targets, int rows, int vocab,
                                      float loss_scale) override;
  double sum(const float* x, size_t elems) override;

  double sum_of_squares(const float* x, size_t elems) override;
  void scale(float* x, size_t elems, float factor) override;
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t elems,
                    const AdamWParams& hyper) override;

  void synchronize() override;
  // Events on the compute stream.
  std::unique_ptr<StepTimer> make_step_timer() override;

 private:
  struct Allocation {
    size_t bytes = 0;
    MemoryKind kind = MemoryKind::other;
  };

  void* allocate_bytes(size_t bytes, MemoryKind kind);
  void copy_host_to_device(void* dst, const void* host_src, size_t bytes);
  // A device buffer of at least `elems` floats, shared by every op that needs scratch:
  // ops run in stream order, so one op's use ends before the next op's begins. Grows
  // (after a stream synchronisation) and never shrinks.
  float* scratch_floats(size_t elems);
  double read_device_double();
  // Updates peak_used_bytes_ from cudaMemGetInfo.
  void sample_device_usage() const;

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;

  float* scratch_ = nullptr;
  size_t scratch_elems_ = 0;
  // Partials and result of sum / sum_of_squares, and the pinned word the result is
  // read back through.
  double* reduction_partials_ = nullptr;
  size_t reduction_partials_elems_ = 0;
  double* device_result_ = nullptr;
  double* host_result_ = nullptr;

  // The comm thread may allocate or release staging buffers while the compute thread
  // does the same.
  mutable std::mutex memory_mutex_;
  std::unordered_map<void*, Allocation> allocations_;
  std::array<size_t, kMemoryKindCount> bytes_by_kind_{};
  mutable size_t peak_used_bytes_ = 0;
};

}  // namespace scalestudy
