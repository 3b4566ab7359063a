#pragma once
// Builds the backend and the communicator a run asked for, on this rank's device.
#include <functional>
#include <memory>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/mpi_runtime.h"
#include "config/backend_config.h"
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
BackendSetup make_backend(const BackendConfig& config, const ProcessPlacement& where);

// --attention-kernel as this machine answers it: auto is cudnn for cuda in bf16 where
// libcudnn 9 loads (cuDNN's fused attention is the faster there, docs/benchmarks.md), and
// flash otherwise; an explicit value stays. Resolved before the run records its config,
// so that the file names the kernels used and ranks that resolve differently disagree in
// the start-up's configuration check.
AttentionKernel choose_attention_kernel(const std::string& backend, Precision precision, AttentionKernel requested);

}  // namespace scalestudy
