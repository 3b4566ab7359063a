#include "core/memory_kind.h"

#include "core/enum_names.h"

namespace scalestudy {

namespace {

// The names are the ones the results file and the memory report use as keys, so they
// must stay stable across versions.
constexpr EnumNames<MemoryKind, kMemoryKindCount> kMemoryKindNames{
    {"parameters", "gradients", "optimizer", "activations", "communication", "other"}, "unknown"};
static_assert(kMemoryKindNames.complete());

}  // namespace

const char* memory_kind_name(MemoryKind kind) { return kMemoryKindNames.name(kind); }

}  // namespace scalestudy
