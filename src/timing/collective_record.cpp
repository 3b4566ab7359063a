#include "timing/collective_record.h"

namespace scalestudy {

// The names match the enumerators so that result files and the analysis package can map
// them back without a second table.
const char* collective_kind_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::allreduce: return "allreduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::allgather: return "allgather";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::barrier: return "barrier";
  }
  return "unknown";
}

}  // namespace scalestudy
