#pragma once
// The CUDA backend's memory (DeviceMemory): its device, the compute stream that copies and
// fills run on, and the registry of what every buffer holds. CudaOps computes on it.
//
// Copies that hand data to the host (copy_to_host, copy_from_host) synchronise the stream
// so that their host buffers are safe to read or reuse on return; the rest are queued.
//
// Precision::bf16 and Precision::fp16 (mixed precision, fp32 master weights) store alike;
// they differ only in the 16-bit storage type, __nv_bfloat16 or __half ("16-bit" below
// means that type):
// - Every MemoryKind::activations buffer from allocate_floats holds 16-bit values behind
//   its float* handle (elems * 2 bytes). Handles are opaque: only the pointer returned by
//   allocate_floats (or activation_at) may be passed (an offset into 16-bit storage is
//   rejected). allocate_statistics buffers (LayerNorm mean/rstd, losses) and every other
//   kind (parameters, gradients, optimizer state, communication) stay fp32.
// - Ops follow the storage of their activation operands, found from the registry
//   (stores_half, half_operands): all 16-bit runs the kernels instantiated for the
//   precision's type, all fp32 runs the fp32 ones, and a mix is an error. fill_zero, copy,
//   copy_to_host and copy_from_host convert between 16-bit storage and fp32 values (on the
//   host with half_host.h's conversions, which round as the device does).
// - The MemoryKind::parameters allocation gets a 16-bit copy of the same length. Every op
//   that reads a parameter reads it from the copy, at the parameter's offset: forward and
//   backward see the rounded parameters only, and the fp32 masters are the optimizer's. So
//   a strategy that moves parameters between ranks moves the copy (compute_copy_of); zero2
//   gathers 16 bits a parameter. The copy is refreshed by parameters_changed(), by the
//   fused AdamW, or by such a gather; until the first refresh it holds NaN, so a forgotten
//   one shows up as a NaN loss rather than as silently stale weights.
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>

#include "backend/backend.h"
#include "core/precision.h"
#include "scratch.cuh"

namespace scalestudy {

class CudaMemory : public Backend {
 public:
  // Makes `device` current for the calling thread and creates the compute stream.
  CudaMemory(int device, Precision precision);
  ~CudaMemory() override;

  int device() const { return device_; }
  Precision precision() const { return precision_; }
  // The compute stream: every op and copy of this backend runs on it, in issue order.
  cudaStream_t stream() const { return stream_; }

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
  // Includes the backend's own scratch buffers and workspaces, under MemoryKind::other.
  size_t allocated_bytes(MemoryKind kind) const override;
  // The largest device-wide use (total - free, from cudaMemGetInfo) seen at any of this
  // backend's allocations, releases or peak queries. Device-wide: it includes the CUDA
  // context, cuBLAS and NCCL buffers, and anything else on the GPU (one rank per GPU).
  size_t measured_peak_bytes() const override;
  std::string peak_source() const override { return "cudaMemGetInfo"; }

  // ---- the parameters' 16-bit copy (Ops) ----------------------------------------------
  // bf16 / fp16: casts the range into the parameters' 16-bit copy, on the compute stream
  // (in fp16, masters beyond 65504 become +-inf there).
  void parameters_changed(const float* params, size_t begin_elems, size_t end_elems) override;
  uint16_t* compute_copy_of(float* params) override;
  // In bf16/fp16 the logits' rows are padded to a multiple of 64 elements
  // (cuda::padded_logits_row_elems), so that the LM head's GEMMs read and write them in
  // place, each row from the start of a 128-byte line; in fp32 they are the plain [N,V] of
  // the default.
  float* allocate_logits(int rows, int vocab) override;

 protected:
  // An activation operand of an op, for the storage check.
  struct Operand {
    const void* ptr;
    const char* what;
  };
  // bf16 or fp16: activations and the parameters' copy are 16-bit.
  bool half_mode() const { return precision_ == Precision::bf16 || precision_ == Precision::fp16; }
  // The name of the mode, for messages: "bf16" or "fp16" (or "fp32").
  const char* mode_name() const { return precision_name(precision_); }
  // Whether ptr's storage is 16-bit. Always false in fp32 mode; in the 16-bit modes an
  // offset into 16-bit storage is an error unless activation_at gave it.
  bool stores_half(const void* ptr, const char* what) const;
  // Whether the (non-null) operands of `op` are all 16-bit; a mix aborts.
  bool half_operands(const char* op, std::initializer_list<Operand> operands) const;
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
  // The padded row stride of a 16-bit logits buffer from allocate_logits (checked against
  // rows and vocab), or 0 for any other buffer.
  int padded_logits_stride(const float* logits, int rows, int vocab) const;
  // A device buffer of at least `elems` floats, shared by every op that needs scratch:
  // ops run in stream order, so one op's use ends before the next op's begins. Grows
  // (after a stream synchronisation) and never shrinks.
  float* scratch_floats(size_t elems);
  // The same scratch as a launcher takes it: at least `elems` floats, and how many.
  cuda::Scratch scratch_of(size_t elems);
  // Counts device memory that the backend's libraries hold (workspaces, tables) under `kind`.
  void count_bytes(MemoryKind kind, size_t bytes);
  // Updates the measured peak from cudaMemGetInfo.
  void sample_device_usage() const;

  // Scratch grows by at least this factor, so a sequence of slightly larger requests
  // does not reallocate (and synchronise) every time.
  static constexpr double kScratchGrowth = 1.5;

  const int device_;
  const Precision precision_;
  cudaStream_t stream_ = nullptr;

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
  // cudaMalloc on this backend's device. Out of memory throws OutOfMemoryError; any other
  // failure aborts with a report.
  void* device_malloc(size_t bytes, MemoryKind kind);
  void* allocate_bytes(size_t bytes, MemoryKind kind, bool half = false);
  Lookup find_allocation(const void* ptr) const;
  // Whether ptr is a handle activation_at gave out.
  bool is_activation_view(const void* ptr) const;
  void copy_host_to_device(void* dst, const void* host_src, size_t bytes);

  float* scratch_ = nullptr;
  size_t scratch_elems_ = 0;
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
