#pragma once
// Per-rank memory accounting: what a block of memory holds (MemoryKind, for the backends'
// blocks and the communicators'); the memory a run holds at its peak, by kind, predicted
// before it allocates (the memory preflight), with the head-room kept beside a prediction
// when it is compared with the memory available; the host memory of this process, its
// peak and what new allocations may still take; and the error an allocation that cannot
// be satisfied throws.
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace scalestudy {

enum class MemoryKind { parameters, gradients, optimizer, activations, communication, other };
inline constexpr int kMemoryKindCount = 6;
const char* memory_kind_name(MemoryKind kind);

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

// The process's peak resident set (VmHWM from /proc/self/status), in bytes; 0 where
// /proc is missing.
size_t peak_resident_bytes();

// The host's MemAvailable (/proc/meminfo), in bytes: what new allocations may take
// without swapping, shared by every process of the host. SIZE_MAX where /proc is
// missing, so that nothing is refused for want of a number.
size_t host_available_bytes();

// An allocation that the device or the host could not satisfy. The backends (and the
// communicators' staging) throw it instead of ending the job inside the allocator, so
// that the run ends once, naming what it was allocating ("out of memory while allocating
// activations"), with its result file marked failed.
class OutOfMemoryError : public std::runtime_error {
 public:
  // where: the allocator, e.g. "cpu backend" or "cuda backend on device 0"; detail: what it
  // knows of the memory left, or empty.
  OutOfMemoryError(MemoryKind kind, size_t bytes, const std::string& where, const std::string& detail = "");
  // The same failure, with when it happened appended: "in step 3", "before the first step".
  OutOfMemoryError(const OutOfMemoryError& cause, const std::string& when);

  MemoryKind kind() const { return kind_; }
  size_t bytes() const { return bytes_; }

 private:
  MemoryKind kind_;
  size_t bytes_;
};

}  // namespace scalestudy
