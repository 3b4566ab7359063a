#pragma once
// The memory preflight: before a run allocates its model, each rank estimates its memory
// (parallel/training_memory.h) and compares it, with head-room, with what it may take: its
// GPU's free memory, or on the CPU the host's MemAvailable divided among the node's ranks.
// The ranks agree over the control plane, so that a run that does not fit is refused on
// every rank alike, with one usage error (exit code 2) that names the batch option, the
// model, the bytes needed and available, and the --recompute on and --grad-accum that
// would fit where one would.
#include <mpi.h>

#include <cstddef>
#include <string>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/run_config.h"
#include "core/memory_estimate.h"
#include "parallel/bucket_plan.h"

namespace scalestudy {

struct MemoryPreflight {
  MemoryEstimate estimate;       // this rank's, including what the backend held already
  size_t held_bytes = 0;         // what the backend held already (its start-up workspaces)
  size_t available_bytes = 0;    // this rank's share of the memory available
  std::string available_source;  // where available_bytes comes from, for messages
  // The run's buffers still to be allocated, with head-room.
  size_t needed_bytes() const;
  // "memory per rank: estimated 1.52 GiB (parameters ..., ...) of 15.3 GiB available (...)".
  std::string describe() const;
};

// `config` is resolved for the world (resolve_for_world). Collective over `control`.
// Throws UsageError on every rank when the run does not fit on some rank.
MemoryPreflight check_training_memory(const RunConfig& config, const BucketPlan& plan, const Backend& backend,
                                      const Communicator& comm, MPI_Comm control);

}  // namespace scalestudy
