#pragma once
// What the comm stream did for one collective: its kind, the phase that started it, its
// bytes and its interval, and when compute waited for it. Communicators write these
// records; the step clock and the result files read them.
#include <cstddef>
#include <limits>
#include <string>

#include "core/enum_names.h"

namespace scalestudy {

enum class CollectiveKind { allreduce, reduce_scatter, allgather, broadcast, barrier };
inline constexpr int kCollectiveKindCount = 5;
// The names match the enumerators so that result files and the analysis package can map
// them back without a second table.
inline constexpr EnumNames<CollectiveKind, kCollectiveKindCount> kCollectiveKindNames{
    {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"}, "unknown"};
static_assert(kCollectiveKindNames.complete());
inline const char* collective_kind_name(CollectiveKind kind) { return kCollectiveKindNames.name(kind); }

// What the comm stream did for one collective, for timing and byte accounting.
// Times are seconds on the steady clock since Communicator::epoch().
struct CollectiveRecord {
  CollectiveKind kind = CollectiveKind::barrier;
  std::string phase;        // the training phase that started it, e.g. "grad-comm"
  size_t payload_bytes = 0; // bytes of the full (unsharded) buffer the collective covers
  double begin_s = 0.0;
  double end_s = 0.0;
  // When the compute stream was blocked in finish() waiting for this collective; NaN
  // when it never waited (the collective was done, or hidden, by then). Blocked time
  // inside a compute phase is communication that compute did not hide.
  double wait_begin_s = std::numeric_limits<double>::quiet_NaN();
  double wait_end_s = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace scalestudy
