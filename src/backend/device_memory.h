#pragma once
// The memory of a backend's device: buffers, fills and copies, and what they add up to.
// Pointers are the backend's own memory (host on cpu, device on cuda).
//
// An allocation that the device (or host) cannot satisfy throws OutOfMemoryError
// (core/memory_estimate.h) naming the kind and the bytes; anything else that fails ends the
// job as every failed check does.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/memory_estimate.h"

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
  // fp32 per-row statistics and losses (LayerNorm mean/rstd, per-token losses), whatever
  // the activation precision: counted as activations, but always fp32, because rstd
  // rounded to bf16 would bias every backward through it.
  virtual float* allocate_statistics(size_t elems) = 0;
  virtual int32_t* allocate_ints(size_t elems, MemoryKind kind) = 0;
  // The bytes these allocations take, as allocated_bytes counts them, without making them:
  // the memory preflight sums a run's buffers with them before it allocates any. Statistics
  // and ints are 4 bytes an element on every backend.
  virtual size_t floats_bytes(size_t elems, MemoryKind kind) const = 0;
  // The handle of element `elems` of an activation buffer: where a caller lays several
  // activations out in one allocation, the offset follows the storage precision. Release
  // takes the allocation's own handle only.
  virtual float* activation_at(float* activations, size_t elems) const = 0;
  static size_t statistics_bytes(size_t elems) { return elems * sizeof(float); }
  static size_t ints_bytes(size_t elems) { return elems * sizeof(int32_t); }
  virtual void release(void* ptr) = 0;
  virtual void fill_zero(float* dst, size_t elems) = 0;
  virtual void copy(float* dst, const float* src, size_t elems) = 0;
  virtual void copy_to_host(float* host_dst, const float* src, size_t elems) = 0;
  virtual void copy_from_host(float* dst, const float* host_src, size_t elems) = 0;
  // In stream order, without waiting for the stream; host_src may be reused at once.
  virtual void copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) = 0;

  // What new allocations may take now: the device's free memory (cudaMemGetInfo) on a
  // GPU; on the CPU the host's MemAvailable, which every process of the host shares.
  virtual size_t available_bytes() const = 0;
  // Bytes currently allocated through this backend, by kind.
  virtual size_t allocated_bytes(MemoryKind kind) const = 0;
  // The measured peak memory of this rank where the backend computes, and the name of
  // the measurement ("VmHWM" on the CPU, "cudaMemGetInfo" on a GPU).
  virtual size_t measured_peak_bytes() const = 0;
  virtual std::string peak_source() const = 0;
};

}  // namespace scalestudy
