#include "backend/cuda/cuda_memory.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/cuda_storage.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/half_host.h"
#include "core/memory_estimate.h"
#include "cuda_check.h"
#include "elementwise.cuh"
#include "matmul.cuh"
#include "profile/kernel_tag.h"

// The CUDA backend's memory: the registry of what each buffer stores, the parameters'
// 16-bit copy, scratch, fills and copies.
namespace scalestudy {

using namespace cuda_storage;

namespace {

// cudaMalloc returns 256-byte aligned blocks; a zero-byte request still gets a real
// block, because callers take a null pointer for failure.
constexpr size_t kMinAllocationBytes = 256;

}  // namespace

CudaMemory::CudaMemory(int device, Precision precision) : device_(device), precision_(precision) {
  const int count = cuda_device_count();
  SCALESTUDY_CHECK(device >= 0 && device < count,
                   "cuda backend: device " + std::to_string(device) + " requested, " +
                       std::to_string(count) + " visible");
  CHECK_CUDA(cudaSetDevice(device_));
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaMemory::~CudaMemory() {
  CHECK_CUDA(cudaSetDevice(device_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  for (auto& entry : allocations_) {
    CHECK_CUDA(cudaFree(reinterpret_cast<void*>(entry.first)));
    CHECK_CUDA(cudaFree(entry.second.parameter_copy));
  }
  CHECK_CUDA(cudaFree(scratch_));
  for (PinnedSlot& slot : pinned_slots_) {
    if (slot.copied) CHECK_CUDA(cudaEventSynchronize(slot.copied));
    if (slot.copied) CHECK_CUDA(cudaEventDestroy(slot.copied));
    if (slot.host) CHECK_CUDA(cudaFreeHost(slot.host));
  }
  CHECK_CUDA(cudaStreamDestroy(stream_));
}

void CudaMemory::count_bytes(MemoryKind kind, size_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  bytes_by_kind_[static_cast<size_t>(kind)] += bytes;
}

void* CudaMemory::device_malloc(size_t bytes, MemoryKind kind) {
  // The comm thread may allocate too, and the current device is per thread.
  CHECK_CUDA(cudaSetDevice(device_));
  void* ptr = nullptr;
  const cudaError_t rc = cudaMalloc(&ptr, std::max(bytes, kMinAllocationBytes));
  if (rc != cudaSuccess) {
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    if (rc == cudaErrorMemoryAllocation)
      throw OutOfMemoryError(kind, bytes, "cuda backend on device " + std::to_string(device_),
                             human_bytes(free_bytes) + " of " + human_bytes(total_bytes) + " free");
    abort_job(__FILE__, __LINE__, "cudaMalloc",
              std::string(cudaGetErrorString(rc)) + " allocating " + std::to_string(bytes) +
                  " bytes of " + memory_kind_name(kind) + " on device " +
                  std::to_string(device_) + " (" + std::to_string(free_bytes) + " of " +
                  std::to_string(total_bytes) + " bytes free)");
  }
  return ptr;
}

void* CudaMemory::allocate_bytes(size_t bytes, MemoryKind kind, bool half) {
  void* ptr = device_malloc(bytes, kind);
  sample_device_usage();
  std::lock_guard<std::mutex> lock(memory_mutex_);
  allocations_[reinterpret_cast<uintptr_t>(ptr)] = Allocation{bytes, kind, half, nullptr, 0};
  bytes_by_kind_[static_cast<size_t>(kind)] += bytes;
  return ptr;
}

size_t CudaMemory::floats_bytes(size_t elems, MemoryKind kind) const {
  if (!half_mode()) return elems * sizeof(float);
  if (kind == MemoryKind::activations) return elems * kHalfBytes;
  return elems * sizeof(float) + (kind == MemoryKind::parameters ? elems * kHalfBytes : 0);
}

float* CudaMemory::allocate_floats(size_t elems, MemoryKind kind) {
  if (!half_mode()) return static_cast<float*>(allocate_bytes(floats_bytes(elems, kind), kind));
  if (kind == MemoryKind::activations)
    return static_cast<float*>(allocate_bytes(floats_bytes(elems, kind), kind, true));
  float* ptr = static_cast<float*>(allocate_bytes(elems * sizeof(float), kind));
  if (kind == MemoryKind::parameters) {
    // All-ones bytes are a NaN in bf16 and in fp16 alike: GEMMs on a copy that
    // parameters_changed never filled give NaN.
    const size_t copy_bytes = floats_bytes(elems, kind) - elems * sizeof(float);
    void* copy = nullptr;
    try {
      copy = device_malloc(copy_bytes, kind);
    } catch (const OutOfMemoryError&) {
      release(ptr);
      throw;
    }
    CHECK_CUDA(cudaMemsetAsync(copy, 0xff, copy_bytes, stream_));
    sample_device_usage();
    std::lock_guard<std::mutex> lock(memory_mutex_);
    Allocation& record = allocations_.at(reinterpret_cast<uintptr_t>(ptr));
    record.parameter_copy = copy;
    record.parameter_copy_bytes = copy_bytes;
    bytes_by_kind_[static_cast<size_t>(kind)] += copy_bytes;
  }
  return ptr;
}

float* CudaMemory::allocate_statistics(size_t elems) {
  return static_cast<float*>(allocate_bytes(statistics_bytes(elems), MemoryKind::activations));
}

int32_t* CudaMemory::allocate_ints(size_t elems, MemoryKind kind) {
  return static_cast<int32_t*>(allocate_bytes(ints_bytes(elems), kind));
}

void CudaMemory::release(void* ptr) {
  if (ptr == nullptr) return;
  void* parameter_copy = nullptr;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto found = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    SCALESTUDY_CHECK(found != allocations_.end(),
                     "cuda backend: release of a pointer this backend did not allocate");
    const Allocation& record = found->second;
    bytes_by_kind_[static_cast<size_t>(record.kind)] -=
        record.bytes + record.parameter_copy_bytes;
    activation_views_.erase(activation_views_.lower_bound(found->first),
                            activation_views_.lower_bound(found->first + record.bytes));
    parameter_copy = record.parameter_copy;
    allocations_.erase(found);
  }
  CHECK_CUDA(cudaSetDevice(device_));
  // Work already queued on the compute stream may still read the buffer.
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  // Whatever others allocated since our last sample may be at its peak now.
  sample_device_usage();
  CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaFree(parameter_copy));
}

size_t CudaMemory::available_bytes() const {
  CHECK_CUDA(cudaSetDevice(device_));
  size_t free_bytes = 0, total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

size_t CudaMemory::allocated_bytes(MemoryKind kind) const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return bytes_by_kind_[static_cast<size_t>(kind)];
}

CudaMemory::Lookup CudaMemory::find_allocation(const void* ptr) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto after = allocations_.upper_bound(address);
  if (after == allocations_.begin()) return Lookup{};
  const auto& [base, record] = *std::prev(after);
  // A zero-byte allocation still owns its base address.
  if (address - base >= std::max<size_t>(record.bytes, 1)) return Lookup{};
  return Lookup{true, base, record};
}

float* CudaMemory::activation_at(float* activations, size_t elems) const {
  const Lookup lookup = find_allocation(activations);
  SCALESTUDY_CHECK(lookup.found && reinterpret_cast<uintptr_t>(activations) == lookup.base &&
                       floats_bytes(elems, MemoryKind::activations) < lookup.allocation.bytes,
                   "cuda backend: activation_at(" + std::to_string(elems) +
                       ") outside an activation allocation, or from a handle that is not one");
  auto* view = reinterpret_cast<float*>(reinterpret_cast<char*>(activations) +
                                        floats_bytes(elems, MemoryKind::activations));
  std::lock_guard<std::mutex> lock(memory_mutex_);
  activation_views_.insert(reinterpret_cast<uintptr_t>(view));
  return view;
}

bool CudaMemory::is_activation_view(const void* ptr) const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return activation_views_.count(reinterpret_cast<uintptr_t>(ptr)) > 0;
}

bool CudaMemory::stores_half(const void* ptr, const char* what) const {
  if (!half_mode() || ptr == nullptr) return false;
  const Lookup lookup = find_allocation(ptr);
  if (!lookup.found || !lookup.allocation.half) return false;
  SCALESTUDY_CHECK(reinterpret_cast<uintptr_t>(ptr) == lookup.base || is_activation_view(ptr),
                   std::string("cuda backend (") + mode_name() + "): " + what + " points into a " +
                       mode_name() +
                       " activation buffer; activation handles are opaque and must be passed "
                       "as allocated");
  return true;
}

bool CudaMemory::half_operands(const char* op, std::initializer_list<Operand> operands) const {
  if (!half_mode()) return false;
  int half = 0, fp32 = 0;
  for (const Operand& operand : operands) {
    if (operand.ptr == nullptr) continue;
    (stores_half(operand.ptr, operand.what) ? half : fp32) += 1;
  }
  SCALESTUDY_CHECK(half == 0 || fp32 == 0,
                   std::string("cuda backend (") + mode_name() + "): " + op + " mixes " +
                       mode_name() +
                       " activations with fp32 buffers; its activation operands must all come "
                       "from allocate_floats(..., MemoryKind::activations)");
  return half > 0;
}

void CudaMemory::require_fp32(const void* ptr, const char* what) const {
  SCALESTUDY_CHECK(!stores_half(ptr, what),
                   std::string("cuda backend (") + mode_name() + "): " + what +
                       " must be fp32 (statistics from allocate_statistics, or gradients, "
                       "parameters, optimizer state), not a " + mode_name() +
                       " activation buffer");
}

void CudaMemory::require_fp32(std::initializer_list<Operand> operands) const {
  for (const Operand& operand : operands) require_fp32(operand.ptr, operand.what);
}

const void* CudaMemory::parameter_copy_or_null(const float* param) const {
  const Lookup lookup = find_allocation(param);
  if (!lookup.found || lookup.allocation.parameter_copy == nullptr) return nullptr;
  return parameter_copy_of(param);
}

const void* CudaMemory::parameter_copy_of(const float* weight) const {
  const Lookup lookup = find_allocation(weight);
  SCALESTUDY_CHECK(lookup.found && lookup.allocation.parameter_copy != nullptr,
                   std::string("cuda backend (") + mode_name() +
                       "): a parameter that an op reads must lie in the MemoryKind::parameters "
                       "allocation, whose 16-bit copy the op reads");
  const size_t offset_bytes = reinterpret_cast<uintptr_t>(weight) - lookup.base;
  SCALESTUDY_CHECK(offset_bytes % sizeof(float) == 0, "cuda backend: misaligned weight pointer");
  return static_cast<const char*>(lookup.allocation.parameter_copy) +
         offset_bytes / sizeof(float) * kHalfBytes;
}

void CudaMemory::parameters_changed(const float* params, size_t begin_elems, size_t end_elems) {
  ScopedKernelTag tag(KernelCategory::optimizer);
  if (!half_mode() || begin_elems == end_elems) return;
  SCALESTUDY_CHECK(begin_elems < end_elems, "parameters_changed: begin after end");
  const Lookup lookup = find_allocation(params);
  SCALESTUDY_CHECK(lookup.found && lookup.allocation.parameter_copy != nullptr,
                   "parameters_changed: the pointer is not in a MemoryKind::parameters "
                   "allocation");
  const size_t offset_bytes = reinterpret_cast<uintptr_t>(params) - lookup.base;
  SCALESTUDY_CHECK(offset_bytes % sizeof(float) == 0 &&
                       offset_bytes + end_elems * sizeof(float) <= lookup.allocation.bytes,
                   "parameters_changed: range outside the parameters allocation");
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    Half* copy =
        static_cast<Half*>(lookup.allocation.parameter_copy) + offset_bytes / sizeof(float);
    cuda::launch_cast(stream_, copy + begin_elems, params + begin_elems, end_elems - begin_elems);
  });
}

uint16_t* CudaMemory::compute_copy_of(float* params) {
  if (!half_mode()) return nullptr;
  static_assert(kHalfBytes == sizeof(uint16_t), "the 16-bit copy is handed out as 16-bit words");
  return static_cast<uint16_t*>(const_cast<void*>(parameter_copy_of(params)));
}

void CudaMemory::sample_device_usage() const {
  size_t free_bytes = 0, total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  std::lock_guard<std::mutex> lock(memory_mutex_);
  peak_used_bytes_ = std::max(peak_used_bytes_, total_bytes - free_bytes);
}

size_t CudaMemory::measured_peak_bytes() const {
  CHECK_CUDA(cudaSetDevice(device_));
  sample_device_usage();
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return peak_used_bytes_;
}

float* CudaMemory::scratch_floats(size_t elems) {
  elems = std::max<size_t>(elems, 1);
  if (elems <= scratch_elems_) return scratch_;
  const size_t grown = std::max(elems, static_cast<size_t>(kScratchGrowth * scratch_elems_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  CHECK_CUDA(cudaFree(scratch_));
  scratch_ = nullptr;
  const cudaError_t rc = cudaMalloc(&scratch_, grown * sizeof(float));
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    // The old scratch is gone: nothing is left to account for.
    std::lock_guard<std::mutex> lock(memory_mutex_);
    bytes_by_kind_[static_cast<size_t>(MemoryKind::other)] -= scratch_elems_ * sizeof(float);
    scratch_elems_ = 0;
    throw OutOfMemoryError(MemoryKind::other, grown * sizeof(float),
                           "cuda backend on device " + std::to_string(device_));
  }
  SCALESTUDY_CHECK(rc == cudaSuccess, std::string(cudaGetErrorString(rc)) +
                                          " allocating " + std::to_string(grown * sizeof(float)) +
                                          " bytes of cuda backend scratch");
  sample_device_usage();
  std::lock_guard<std::mutex> lock(memory_mutex_);
  bytes_by_kind_[static_cast<size_t>(MemoryKind::other)] +=
      (grown - scratch_elems_) * sizeof(float);
  scratch_elems_ = grown;
  return scratch_;
}

cuda::Scratch CudaMemory::scratch_of(size_t elems) {
  float* data = scratch_floats(elems);
  return {data, scratch_elems_};
}

void CudaMemory::fill_zero(float* dst, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  // All-zero bytes are +0 in bf16 and fp16 alike.
  if (stores_half(dst, "fill_zero dst")) {
    if (elems > 0) CHECK_CUDA(cudaMemsetAsync(dst, 0, elems * kHalfBytes, stream_));
    return;
  }
  cuda::launch_fill(stream_, dst, elems, 0.0f);
}

// Overlapping ranges go through scratch: cudaMemcpy, unlike memmove, leaves overlap
// undefined, and the CPU backend allows a copy onto an overlapping view of itself.
// 16-bit handles are whole buffers, so two of them overlap only when they are equal, and
// a 16-bit buffer never overlaps an fp32 one.
void CudaMemory::copy(float* dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  if (elems == 0 || dst == src) return;
  const bool dst_half = stores_half(dst, "copy dst"), src_half = stores_half(src, "copy src");
  if (dst_half && src_half) {
    CHECK_CUDA(
        cudaMemcpyAsync(dst, src, elems * kHalfBytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  if (dst_half || src_half) {
    with_half_type(precision_, [&]<class Half>(Storage<Half>) {
      if (dst_half)
        cuda::launch_cast(stream_, as<Half>(dst), src, elems);
      else
        cuda::launch_cast(stream_, dst, as<Half>(src), elems);
    });
    return;
  }
  const size_t bytes = elems * sizeof(float);
  const auto dst_begin = reinterpret_cast<uintptr_t>(dst);
  const auto src_begin = reinterpret_cast<uintptr_t>(src);
  const bool overlap = dst_begin < src_begin + bytes && src_begin < dst_begin + bytes;
  if (!overlap) {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  float* staging = scratch_floats(elems);
  CHECK_CUDA(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  CHECK_CUDA(cudaMemcpyAsync(dst, staging, bytes, cudaMemcpyDeviceToDevice, stream_));
}

// Queued on the compute stream (a legacy-stream cudaMemcpy would not be ordered with
// it), then waited for: the host buffer holds the data on return. 16-bit storage is
// widened (exactly) on the host.
void CudaMemory::copy_to_host(float* host_dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  if (elems == 0) return;
  if (stores_half(src, "copy_to_host src")) {
    std::vector<uint16_t> bits(elems);
    CHECK_CUDA(cudaMemcpyAsync(bits.data(), src, elems * sizeof(uint16_t),
                               cudaMemcpyDeviceToHost, stream_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < elems; ++i) host_dst[i] = float_from_half_bits(precision_, bits[i]);
    return;
  }
  CHECK_CUDA(cudaMemcpyAsync(host_dst, src, elems * sizeof(float), cudaMemcpyDeviceToHost,
                             stream_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
}

// Waited for as well: from pageable memory cudaMemcpyAsync returns once the data is
// staged, but from pinned memory it returns at once, and the caller may reuse the host
// buffer (the next micro-batch's tokens) as soon as this returns.
void CudaMemory::copy_host_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  CHECK_CUDA(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
}

// 16-bit storage gets the values rounded to nearest even on the host, as the device's
// casts round them (fp16: +-inf from 65520 up).
void CudaMemory::copy_from_host(float* dst, const float* host_src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  if (stores_half(dst, "copy_from_host dst")) {
    std::vector<uint16_t> bits(elems);
    for (size_t i = 0; i < elems; ++i) bits[i] = half_bits_from_float(precision_, host_src[i]);
    copy_host_to_device(dst, bits.data(), elems * sizeof(uint16_t));
    return;
  }
  copy_host_to_device(dst, host_src, elems * sizeof(float));
}

void CudaMemory::copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  const size_t bytes = elems * sizeof(int32_t);
  if (bytes == 0) return;
  PinnedSlot& slot = pinned_slots_[next_pinned_slot_];
  next_pinned_slot_ = (next_pinned_slot_ + 1) % kPinnedSlots;
  if (slot.copied)
    CHECK_CUDA(cudaEventSynchronize(slot.copied));
  else
    CHECK_CUDA(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  if (slot.bytes < bytes) {
    if (slot.host) CHECK_CUDA(cudaFreeHost(slot.host));
    CHECK_CUDA(cudaMallocHost(&slot.host, bytes));
    slot.bytes = bytes;
  }
  std::memcpy(slot.host, host_src, bytes);
  CHECK_CUDA(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
  CHECK_CUDA(cudaEventRecord(slot.copied, stream_));
}

int CudaMemory::padded_logits_stride(const float* logits, int rows, int vocab) const {
  if (!half_mode() || logits == nullptr) return 0;
  const Lookup lookup = find_allocation(logits);
  if (!lookup.found || lookup.allocation.logits_row_elems == 0) return 0;
  const int stride = lookup.allocation.logits_row_elems;
  SCALESTUDY_CHECK(reinterpret_cast<uintptr_t>(logits) == lookup.base &&
                       stride == cuda::padded_logits_row_elems(vocab) &&
                       lookup.allocation.bytes >= size_t(rows) * stride * kHalfBytes,
                   "cuda backend: a logits buffer from allocate_logits is used with other rows "
                   "or another vocabulary than it was allocated for");
  return stride;
}

float* CudaMemory::allocate_logits(int rows, int vocab) {
  if (!half_mode()) return allocate_floats(size_t(rows) * vocab, MemoryKind::activations);
  SCALESTUDY_CHECK(rows > 0 && vocab > 0, "allocate_logits: rows and vocab must be positive");
  const int stride = cuda::padded_logits_row_elems(vocab);
  float* logits = allocate_floats(size_t(rows) * stride, MemoryKind::activations);
  // The padding columns are never read; zeroed, they hold no NaN for a debugger to find.
  CHECK_CUDA(cudaMemsetAsync(logits, 0, size_t(rows) * stride * kHalfBytes, stream_));
  std::lock_guard<std::mutex> lock(memory_mutex_);
  allocations_.at(reinterpret_cast<uintptr_t>(logits)).logits_row_elems = stride;
  return logits;
}

}  // namespace scalestudy
