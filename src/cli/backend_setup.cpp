#include "cli/backend_setup.h"

#include <cmath>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "core/usage_error.h"

#if SCALESTUDY_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "comm/nccl_communicator.h"
#endif

namespace scalestudy {
namespace {

#if SCALESTUDY_HAVE_CUDA
// Dense peak rates from NVIDIA's H100/H200 SXM datasheets; MFU is reported against
// them until a measured peak (scalestudy bench gemm) is available.
void set_datasheet_peak(RunIdentity& identity, Precision precision) {
  const std::string& device = identity.device_name;
  const bool hopper_sxm = device.find("H200") != std::string::npos ||
                          (device.find("H100") != std::string::npos && device.find("PCIe") == std::string::npos);
  identity.peak_tflops_per_gpu = std::nan("");
  identity.peak_source = "none";
  if (!hopper_sxm) return;
  const double tflops = precision == Precision::fp32 ? 66.9 : 989.4;
  identity.peak_tflops_per_gpu = tflops;
  identity.peak_source = std::string("datasheet: NVIDIA H100/H200 SXM dense ") +
                         (precision == Precision::fp32 ? "FP32 (no tensor cores)" : "BF16/FP16 tensor core") +
                         ", " + std::to_string(tflops).substr(0, 5) + " TFLOP/s";
}
#endif

}  // namespace

BackendSetup make_backend(const RunConfig& config, const ProcessPlacement& where) {
  BackendSetup setup;
  if (config.backend == "cpu") {
    setup.ops = std::make_unique<CpuOps>();
    setup.comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, config.comm_timeout_s);
    setup.identity.backend = "cpu";
    setup.identity.device_name = "cpu";
    setup.identity.peak_tflops_per_gpu = std::nan("");
    setup.identity.peak_source = "none";
    return setup;
  }
#if SCALESTUDY_HAVE_CUDA
  const int devices = cuda_device_count();
  if (where.local_rank >= devices)
    throw UsageError("--backend cuda: rank " + std::to_string(where.rank) + " is local rank " +
                     std::to_string(where.local_rank) + " on " + where.host + ", which has " +
                     std::to_string(devices) + " visible GPU(s)");
  auto ops = std::make_unique<CudaOps>(where.local_rank, config.precision);
  setup.comm = std::make_unique<NcclCommunicator>(MPI_COMM_WORLD, ops->stream(), config.comm_timeout_s);
  setup.identity.backend = "cuda";
  setup.identity.device_name = cuda_device_description(where.local_rank);
  setup.identity.cuda_version = cuda_runtime_version();
  setup.identity.nccl_version = NcclCommunicator::nccl_version();
  set_datasheet_peak(setup.identity, config.precision);
  setup.ops = std::move(ops);
  return setup;
#else
  (void)where;
  throw UsageError("--backend " + config.backend + ": this build has no CUDA backend");
#endif
}

}  // namespace scalestudy
