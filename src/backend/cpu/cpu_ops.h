#pragma once
// The reference backend: plain fp32 C++ on the host, single-threaded, with fixed loop
// orders so that the same inputs give bit-identical outputs on every run. It is the
// oracle that the CUDA backend and the distributed strategies are checked against, so
// clarity and determinism come before speed; the loops are still ordered so that inner
// loops walk contiguous memory, because CPU-only scaling runs train real models on it.
//
// Per-row results of a forward op never depend on how many rows are in the call, so a
// micro-batch split across ranks reproduces the one-rank activations exactly.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backend/backend.h"
#include "core/memory_estimate.h"

namespace scalestudy {

// Not final: tests derive from it to watch the calls a strategy makes
// (tests/mpi/test_multiprocessor_reservation.cpp).
class CpuOps : public Backend {
 public:
  CpuOps() = default;
  ~CpuOps() override;

  std::string name() const override { return "cpu"; }

  // ---- DeviceMemory: host memory ----------------------------------------------------
  float* allocate_floats(size_t elems, MemoryKind kind) override;
  // Activations are fp32 here, so statistics are ordinary activation buffers.
  float* allocate_statistics(size_t elems) override {
    return allocate_floats(elems, MemoryKind::activations);
  }
  int32_t* allocate_ints(size_t elems, MemoryKind kind) override;
  size_t floats_bytes(size_t elems, MemoryKind) const override { return elems * sizeof(float); }
  float* activation_at(float* activations, size_t elems) const override { return activations + elems; }
  void release(void* ptr) override;
  void fill_zero(float* dst, size_t elems) override;
  void copy(float* dst, const float* src, size_t elems) override;
  void copy_to_host(float* host_dst, const float* src, size_t elems) override;
  void copy_from_host(float* dst, const float* host_src, size_t elems) override;
  void copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) override;
  size_t available_bytes() const override { return host_available_bytes(); }
  size_t allocated_bytes(MemoryKind kind) const override;
  size_t measured_peak_bytes() const override { return peak_resident_bytes(); }
  std::string peak_source() const override { return "VmHWM"; }

  // ---- DeviceServices: the calling thread is the compute stream ----------------------
  bool runs_asynchronously() const override { return false; }
  void synchronize() override {}
  std::unique_ptr<StepTimer> make_step_timer() override { return std::make_unique<HostStepTimer>(); }

  // ---- Ops ------------------------------------------------------------------------
  void embedding_forward(const EmbeddingForwardArgs<float>& args) override;
  void embedding_backward(const EmbeddingBackwardArgs<float>& args) override;

  void layernorm_forward(const LayerNormForwardArgs<float>& args) override;
  void layernorm_backward(const LayerNormBackwardArgs<float>& args) override;

  void matmul_forward(const MatmulForwardArgs<float>& args) override;
  void matmul_backward(const MatmulBackwardArgs<float>& args) override;
  void classifier_backward_from_dlogits(const ClassifierInputGradientArgs<float>& args) override;
  void classifier_weight_backward(const ClassifierWeightGradientArgs<float>& args) override;

  void attention_forward(float* out, float* probs, const float* qkv,
                         const AttentionShape& shape) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* probs,
                          const AttentionShape& shape, GradientWrite dqkv_write) override;
  // The probabilities, [B,NH,T,T].
  float* allocate_attention_state(const AttentionShape& shape) override;
  size_t attention_state_bytes(const AttentionShape& shape) const override {
    return floats_bytes(attention_probs_elems(shape), MemoryKind::activations);
  }

  void gelu_forward(float* out, const float* inp, size_t elems) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems,
                     GradientWrite dinp_write) override;

  void accumulate(float* dst, const float* src, size_t elems) override;

  // The plain [N,V].
  float* allocate_logits(int rows, int vocab) override;
  size_t logits_bytes(size_t rows, int vocab) const override {
    return floats_bytes(rows * static_cast<size_t>(vocab), MemoryKind::activations);
  }
  void softmax_cross_entropy_forward(float* losses, float* row_stats, const float* logits,
                                     const int32_t* targets, int rows, int vocab) override;
  void softmax_cross_entropy_backward(float* dlogits, const float* logits,
                                      const float* row_stats, const int32_t* targets, int rows,
                                      int vocab, float loss_scale) override;
  double sum(const float* x, size_t elems) override;

  double sum_of_squares(const float* x, size_t elems) override;
  void scale(float* x, size_t elems, float factor) override;
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t elems,
                    const AdamWParams& hyper) override;

  // The CPU computes from the fp32 parameters themselves: nothing to refresh.
  void parameters_changed(const float*, size_t, size_t) override {}

 private:
  struct Allocation {
    size_t bytes = 0;
    MemoryKind kind = MemoryKind::other;
  };

  void* allocate_bytes(size_t bytes, MemoryKind kind);

  // The CPU comm stream is a worker thread, and it may allocate or release staging
  // buffers while the compute thread does the same.
  mutable std::mutex memory_mutex_;
  std::unordered_map<void*, Allocation> allocations_;
  std::array<size_t, kMemoryKindCount> bytes_by_kind_{};
};

}  // namespace scalestudy
