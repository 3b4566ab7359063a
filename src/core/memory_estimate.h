#pragma once
// The memory a run holds at its peak, by MemoryKind, predicted before it allocates (the
// memory preflight), and the head-room kept beside a prediction when it is compared with
// the memory available.
#include <array>
#include <cstddef>
#include <string>

#include "core/memory_kind.h"

namespace scalestudy {

struct MemoryEstimate {
  std::array<size_t, kMemoryKindCount> bytes{};  // by MemoryKind

  size_t& operator[](MemoryKind kind) { return bytes[static_cast<size_t>(kind)]; }
  size_t operator[](MemoryKind kind) const { return bytes[static_cast<size_t>(kind)]; }
  size_t total_bytes() const;
  // "parameters 475 MiB, gradients 475 MiB, ...": the kinds that hold any bytes.
  std::string describe() const;
};

// A prediction plus the head-room kept free beside it, 5 % and 128 MiB: what a prediction
// of the program's own buffers leaves out (the allocator's rounding and bookkeeping, the
// process's heap and libraries, the launcher's and the runtime's memory).
size_t memory_with_headroom(size_t predicted_bytes);

// Bytes in binary units with three significant digits: "17 bytes", "3.20 KiB", "512 MiB",
// "1.50 GiB", up to EiB.
std::string human_bytes(size_t bytes);

}  // namespace scalestudy
