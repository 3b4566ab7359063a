#include "core/memory_kind.h"

namespace scalestudy {

// The names are the ones the results file and the memory report use as keys, so they
// must stay stable across versions.
const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::parameters: return "parameters";
    case MemoryKind::gradients: return "gradients";
    case MemoryKind::optimizer: return "optimizer";
    case MemoryKind::activations: return "activations";
    case MemoryKind::communication: return "communication";
    case MemoryKind::other: return "other";
  }
  return "unknown";
}

}  // namespace scalestudy
