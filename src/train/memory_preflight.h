#pragma once
// The memory preflight: before a run allocates its model, each rank estimates its memory
// and compares it, with head-room, with what it may take: its GPU's free memory, or on the
// CPU the host's MemAvailable divided among the node's ranks. The ranks agree over the
// control plane, so that a run that does not fit is refused on every rank alike, with one
// usage error (exit code 2) that names the batch option, the model, the bytes needed and
// available, and the --recompute on and --grad-accum that would fit where one would.
//
// The estimate of one rank's training run holds every buffer the run allocates through
// the backend and the communicator, by kind, for the strategy, the precision and the
// recomputation in use. Each term comes from the size functions that the allocations
// themselves use (Gpt::parameter_bytes and activation_bytes, the strategies'
// planned_memory, the backend's scratch and the communicator's staging), so the estimate
// is what the run allocates, exactly for the buffers that the constructors allocate, and
// an upper bound for the ones that grow in the first steps.
#include <mpi.h>

#include <cstddef>
#include <string>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/run_config.h"
#include "core/memory_estimate.h"
#include "core/model_shape.h"
#include "parallel/bucket_plan.h"
#include "parallel/strategy.h"

namespace scalestudy {

struct TrainingMemoryInputs {
  StrategyMemoryInputs strategy;  // its layout is make_parameter_layout(shape)
  const ModelShape& shape;
  int micro_batch = 1;  // sequences per micro-batch
  int seq = 1;
  bool recompute = false;
};

// The estimate includes what the backend holds already (its start-up workspaces, under
// other), so that it compares with the backend's own accounting; what the run still has
// to allocate is the estimate less that.
MemoryEstimate estimate_training_memory(const TrainingMemoryInputs& inputs);

// Whether the ops can run a micro-batch of this many tokens: they count rows in int.
bool rows_fit_the_ops(int micro_batch, int seq);

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
