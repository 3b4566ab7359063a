#include "cli/backend_setup.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <vector>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "core/usage_error.h"

#if SCALESTUDY_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/nvml_telemetry.h"
#include "comm/nccl_communicator.h"
#include "comm/nccl_transport.h"
#include "gemm_choice_file.cuh"
#endif

namespace scalestudy {
namespace {

#if SCALESTUDY_HAVE_CUDA
// --link-emulation socket: NCCL's settings, before its first call. The loopback interface
// joins only the ranks of one host, so a job across hosts is refused.
void set_up_link_emulation(const BackendConfig& config, const ProcessPlacement& where) {
  if (config.link_emulation != "socket") return;
  if (where.node_count > 1)
    throw UsageError("--link-emulation socket: emulates separate nodes with the GPUs of one host, and this job "
                     "spans " + std::to_string(where.node_count) + " nodes (leave the option out: its links "
                     "between the nodes are real)");
  apply_socket_emulation();
}

// --gemm-algos-file, read for this rank's GPU in the 16-bit modes (null: none to read). A
// file that is not in the format is bad input; one made for another GPU model or cuBLASLt
// is set aside with a warning, and the run takes --gemm-algos.
std::shared_ptr<cuda::GemmChooser> read_gemm_choices(const BackendConfig& config, const ProcessPlacement& where) {
  if (config.gemm_algos_file.empty() || !is_16bit(config.precision)) return nullptr;
  try {
    auto file = std::make_shared<cuda::GemmChoiceFile>(
        cuda::GemmChoiceFile::read(config.gemm_algos_file, cuda::gemm_machine(where.local_rank)));
    if (file->set_aside_because().empty()) return file;
    if (where.rank == 0)
      std::fprintf(stderr, "scalestudy: --gemm-algos-file: %s; its choices are set aside\n",
                   file->set_aside_because().c_str());
    return nullptr;
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--gemm-algos-file ") + error.what());
  }
}

// What the result file records of NCCL's links, and what rank 0 says of them.
void record_links(const BackendConfig& config, const ProcessPlacement& where, const NcclCommunicator& nccl,
                  RunIdentity& identity) {
  identity.link_emulation = config.link_emulation;
  identity.nccl_transports = nccl.transports();
  for (const auto& [name, value] : nccl.nccl_environment())
    identity.nccl_environment += (identity.nccl_environment.empty() ? "" : "\n") + name + "=" + value;
  const bool emulated = config.link_emulation == "socket";
  if (emulated && where.world_size > 1 && nccl.transports() != "NET/Socket" && nccl.transports() != kTransportUnknown)
    std::fprintf(stderr, "rank %d on %s: --link-emulation socket, yet NCCL connected through %s, not only its "
                 "sockets%s\n", where.rank, where.host.c_str(), nccl.transports().c_str(),
                 nccl.transports().find("NVLS") != std::string::npos ? " (NCCL_NVLS_ENABLE=0 keeps NVLS off)" : "");
  if (where.rank != 0 || where.world_size == 1) return;
  if (nccl.transports() == kTransportUnknown)
    std::printf("NCCL's transports on rank 0: unknown (%s)%s\n", nccl.transports_unknown_why().c_str(),
                emulated ? "; --link-emulation socket" : "");
  else
    std::printf("NCCL's transports on rank 0: %s%s\n", nccl.transports().c_str(),
                emulated ? " (--link-emulation socket: inter-node links emulated on one host)" : "");
  std::fflush(stdout);
}

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

// The CPU has no datasheet figure that fits a single-threaded reference backend, so its
// peak is measured: the best of a few runs of the backend's own matmul at a size that
// fits in cache.
double measure_cpu_matmul_tflops(Backend& ops) {
  constexpr int kSize = 256, kRuns = 5;
  std::vector<float> host(static_cast<size_t>(kSize) * kSize);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
  float* a = ops.allocate_floats(host.size(), MemoryKind::other);
  float* w = ops.allocate_floats(host.size(), MemoryKind::other);
  float* out = ops.allocate_floats(host.size(), MemoryKind::other);
  ops.copy_from_host(a, host.data(), host.size());
  ops.copy_from_host(w, host.data(), host.size());
  double best_s = 1e30;
  for (int run = 0; run < kRuns; ++run) {
    const auto begin = std::chrono::steady_clock::now();
    ops.matmul_forward({.out = out, .inp = a, .weight = w, .rows = kSize, .in_channels = kSize,
                        .out_channels = kSize});
    best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  }
  for (float* p : {a, w, out}) ops.release(p);
  return 2.0 * kSize * kSize * kSize / best_s / 1e12;
}

}  // namespace

AttentionKernel choose_attention_kernel(const std::string& backend, Precision precision, AttentionKernel requested) {
  if (requested != AttentionKernel::auto_select) return requested;
#if SCALESTUDY_HAVE_CUDA
  std::string why_not;
  if (backend == "cuda" && precision == Precision::bf16 && cudnn_attention_loadable(why_not))
    return AttentionKernel::cudnn;
#else
  (void)backend;
  (void)precision;
#endif
  return AttentionKernel::flash;
}

BackendSetup make_backend(const BackendConfig& config, const ProcessPlacement& where) {
  BackendSetup setup;
  if (config.backend == "cpu") {
    setup.ops = std::make_unique<CpuOps>();
    setup.comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, config.comm_timeout_s);
    setup.make_group_comm = [timeout_s = config.comm_timeout_s](MPI_Comm group) -> std::unique_ptr<Communicator> {
      return std::make_unique<MpiCommunicator>(group, timeout_s);
    };
    setup.identity.backend = "cpu";
    setup.identity.device_name = "cpu";
    setup.identity.peak_tflops_per_gpu = measure_cpu_matmul_tflops(*setup.ops);
    setup.identity.peak_source = "measured: cpu backend fp32 matmul 256x256x256, best of 5";
    return setup;
  }
#if SCALESTUDY_HAVE_CUDA
  set_up_link_emulation(config, where);
  const int devices = cuda_device_count();
  if (where.local_rank >= devices)
    throw UsageError("--backend cuda: rank " + std::to_string(where.rank) + " is local rank " +
                     std::to_string(where.local_rank) + " on " + where.host + ", which has " +
                     std::to_string(devices) + " visible GPU(s)");
  if (resolve_attention_kernel(config.attention_kernel) == AttentionKernel::cudnn) {
    std::string why_not;
    if (!cudnn_attention_loadable(why_not))
      throw UsageError("--attention-kernel cudnn: " + why_not + " (rank " + std::to_string(where.rank) + " on " +
                       where.host + ")");
  }
  auto ops = std::make_unique<CudaOps>(where.local_rank, config.precision, config.gemm_algos,
                                       config.attention_kernel, read_gemm_choices(config, where));
  auto nccl = std::make_unique<NcclCommunicator>(MPI_COMM_WORLD, ops->stream(), config.comm_timeout_s,
                                                 config.overlapped_ctas);
  record_links(config, where, *nccl, setup.identity);
  setup.comm = std::move(nccl);
  setup.make_group_comm = [stream = ops->stream(), timeout_s = config.comm_timeout_s,
                           ctas = config.overlapped_ctas](MPI_Comm group) -> std::unique_ptr<Communicator> {
    return std::make_unique<NcclCommunicator>(group, stream, timeout_s, ctas);
  };
  setup.identity.backend = "cuda";
  setup.identity.device_name = cuda_device_description(where.local_rank);
  setup.identity.device_uuid = cuda_device_uuid(where.local_rank);
  setup.identity.device_pci_bus_id = cuda_device_pci_bus_id(where.local_rank);
  setup.identity.cuda_version = cuda_runtime_version();
  setup.identity.nccl_version = NcclCommunicator::nccl_version();
  set_datasheet_peak(setup.identity, config.precision);
  setup.ops = std::move(ops);
  if (config.gpu_telemetry_ms > 0) {
    std::string why_not;
    setup.telemetry =
        make_nvml_telemetry(where.local_rank, std::chrono::milliseconds(config.gpu_telemetry_ms), why_not);
    if (!setup.telemetry)
      std::fprintf(stderr, "rank %d on %s: --gpu-telemetry-ms %d: no GPU state is recorded: %s\n", where.rank,
                   where.host.c_str(), config.gpu_telemetry_ms, why_not.c_str());
  }
  return setup;
#else
  (void)where;
  throw UsageError("--backend " + config.backend + ": this build has no CUDA backend");
#endif
}

}  // namespace scalestudy
