#pragma once
// What a block of memory holds, for per-rank memory accounting: the backend's blocks and
// the communicator's.

namespace scalestudy {

enum class MemoryKind { parameters, gradients, optimizer, activations, communication, other };
inline constexpr int kMemoryKindCount = 6;
const char* memory_kind_name(MemoryKind kind);

}  // namespace scalestudy
