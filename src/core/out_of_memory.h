#pragma once
// An allocation that the device or the host could not satisfy. The backends (and the
// communicators' staging) throw it instead of ending the job inside the allocator, so
// that the run ends once, naming what it was allocating ("out of memory while allocating
// activations"), with its result file marked failed.
#include <cstddef>
#include <stdexcept>
#include <string>

#include "core/memory_kind.h"

namespace scalestudy {

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
