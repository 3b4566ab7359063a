#include "core/out_of_memory.h"

#include "core/memory_estimate.h"

namespace scalestudy {
namespace {

// What a kind's allocation holds, as the message names it: "other" is the backends' own
// scratch and workspaces.
std::string allocation_name(MemoryKind kind) {
  return kind == MemoryKind::other ? "backend scratch" : memory_kind_name(kind);
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(MemoryKind kind, size_t bytes, const std::string& where,
                                   const std::string& detail)
    : std::runtime_error("out of memory while allocating " + allocation_name(kind) + " (" +
                         human_bytes(bytes) + ", " + where + (detail.empty() ? "" : "; " + detail) + ")"),
      kind_(kind),
      bytes_(bytes) {}

OutOfMemoryError::OutOfMemoryError(const OutOfMemoryError& cause, const std::string& when)
    : std::runtime_error(std::string(cause.what()) + " " + when), kind_(cause.kind_), bytes_(cause.bytes_) {}

}  // namespace scalestudy
