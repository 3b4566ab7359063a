#pragma once
// Builds the backend and the communicator a run asked for, on this rank's device.
#include <functional>
#include <memory>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/mpi_runtime.h"
#include "config/run_config.h"
#include "profile/gpu_state.h"
#include "results/run_recorder.h"

namespace scalestudy {

struct BackendSetup {
  std::unique_ptr<Backend> ops;
  std::unique_ptr<Communicator> comm;
  // A communicator of the same kind as comm over a group of ranks (MPI's over the group,
  // or NCCL's initialised over it with ncclCommInitRank), built by every rank of the group.
  std::function<std::unique_ptr<Communicator>(MPI_Comm group)> make_group_comm;
  RunIdentity identity;  // without argv
  std::unique_ptr<GpuTelemetry> telemetry;  // --gpu-telemetry-ms; null when off or without NVML
};

// cpu: CpuOps and the MPI communicator. cuda: the device is the node-local rank (from
// MPI_Comm_split_type, so srun and mpirun agree), CudaOps, NCCL, and the device's NVML
// sampler; a rank whose NVML fails prints why and runs without it.
BackendSetup make_backend(const RunConfig& config, const ProcessPlacement& where);

}  // namespace scalestudy
