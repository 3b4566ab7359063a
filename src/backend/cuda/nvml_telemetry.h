#pragma once
// GpuTelemetry from NVML: a thread samples one GPU's SM clock, instantaneous power,
// temperature and clock event reasons every period. libnvidia-ml (the driver's) is opened
// with dlopen, so a build needs no NVML headers and a node without the library still
// runs; such a rank records no samples.
#include <chrono>
#include <memory>
#include <string>

#include "profile/gpu_state.h"

namespace scalestudy {

// The telemetry of CUDA device `device` (its NVML handle found by PCI bus id, which is
// what CUDA_VISIBLE_DEVICES leaves unchanged), sampled every period; or nullptr with
// why_not set when NVML cannot be loaded or does not know the device.
std::unique_ptr<GpuTelemetry> make_nvml_telemetry(int device, std::chrono::milliseconds period,
                                                  std::string& why_not);

}  // namespace scalestudy
