#pragma once
// The CPU backend with a record of the most bytes it ever held at once, and the sum of a
// backend's accounting over its kinds: what the memory tests compare the preflight's
// estimate with.
#include <algorithm>
#include <array>
#include <cstddef>
#include <mutex>

#include "backend/cpu/cpu_ops.h"

namespace scalestudy {

inline size_t accounted_bytes(const DeviceMemory& memory) {
  size_t total = 0;
  for (int k = 0; k < kMemoryKindCount; ++k) total += memory.allocated_bytes(static_cast<MemoryKind>(k));
  return total;
}

class PeakTrackingCpuOps : public CpuOps {
 public:
  // Every allocation of the CPU backend (statistics, attention state and logits too) goes
  // through these two.
  float* allocate_floats(size_t elems, MemoryKind kind) override {
    float* buffer = CpuOps::allocate_floats(elems, kind);
    note_peak();
    return buffer;
  }
  int32_t* allocate_ints(size_t elems, MemoryKind kind) override {
    int32_t* buffer = CpuOps::allocate_ints(elems, kind);
    note_peak();
    return buffer;
  }
  // The most bytes held at once.
  size_t peak_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_bytes_;
  }

 private:
  void note_peak() {
    const size_t total = accounted_bytes(*this);
    std::lock_guard<std::mutex> lock(mutex_);
    peak_bytes_ = std::max(peak_bytes_, total);
  }
  mutable std::mutex mutex_;
  size_t peak_bytes_ = 0;
};

}  // namespace scalestudy
