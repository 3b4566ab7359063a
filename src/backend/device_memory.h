#pragma once
// The memory of a backend's device: buffers, fills and copies, and what they add up to.
// Pointers are the backend's own memory (host on cpu, device on cuda).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/memory_kind.h"

namespace scalestudy {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // Buffers of `elems` elements. Activations (MemoryKind::activations) are handles whose
  // storage precision is the backend's business: a backend that computes in bf16 stores
  // them as bf16 behind the float* type, so callers never dereference them or offset
  // them; they pass them to ops, to fill_zero/copy/copy_to_host/copy_from_host (which
  // convert), and release them. Every other kind is plain fp32.
  virtual float* allocate_floats(size_t elems, MemoryKind kind) = 0;
  // The bytes that allocate_floats(elems, kind) takes, with whatever the backend keeps
  // beside the buffer (a 16-bit copy of the parameters), for predicting memory.
  virtual size_t floats_bytes(size_t elems, MemoryKind kind) const = 0;
  // fp32 per-row statistics and losses (LayerNorm mean/rstd, per-token losses), whatever
  // the activation precision: counted as activations, but always fp32, because rstd
  // rounded to bf16 would bias every backward through it.
  virtual float* allocate_statistics(size_t elems) = 0;
  virtual int32_t* allocate_ints(size_t elems, MemoryKind kind) = 0;
  virtual void release(void* ptr) = 0;
  virtual void fill_zero(float* dst, size_t elems) = 0;
  virtual void copy(float* dst, const float* src, size_t elems) = 0;
  virtual void copy_to_host(float* host_dst, const float* src, size_t elems) = 0;
  virtual void copy_from_host(float* dst, const float* host_src, size_t elems) = 0;
  // In stream order, without waiting for the stream; host_src may be reused at once.
  virtual void copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) = 0;

  // Bytes currently allocated through this backend, by kind.
  virtual size_t allocated_bytes(MemoryKind kind) const = 0;
  // The measured peak memory of this rank where the backend computes, and the name of
  // the measurement ("VmHWM" on the CPU, "cudaMemGetInfo" on a GPU).
  virtual size_t measured_peak_bytes() const = 0;
  virtual std::string peak_source() const = 0;
};

}  // namespace scalestudy
