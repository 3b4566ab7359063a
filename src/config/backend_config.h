#pragma once
// What making a backend and its communicator reads (cli/backend_setup.h): the backend, its
// precision and kernels, and how its collectives are bounded and linked.
// RunConfig::backend_config() fills it from a run's validated options, and
// BenchConfig::backend_config() (bench/bench_common.h) from a benchmark's.
#include <string>

#include "core/precision.h"

namespace scalestudy {

struct BackendConfig {
  std::string backend = "cpu";  // cpu | cuda
  Precision precision = Precision::fp32;
  AttentionKernel attention_kernel = AttentionKernel::auto_select;
  GemmAlgos gemm_algos = GemmAlgos::timed;
  std::string gemm_algos_file;  // cuda 16-bit: GEMM algorithms chosen by a search, which win for their shapes
  double comm_timeout_s = 300.0;
  std::string link_emulation = "none";  // cuda: none | socket (comm/nccl_transport.h)
  int overlapped_ctas = 0;      // cuda: CTAs of the overlapped buckets' NCCL kernels; 0 = NCCL's choice
  int gpu_telemetry_ms = 0;     // cuda: NVML sampling period; 0 = off
};

}  // namespace scalestudy
