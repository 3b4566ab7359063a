#pragma once
// What the CUDA runtime can see, asked without aborting: tests skip themselves and the
// provenance record names the GPUs through these.
#include <string>

namespace scalestudy {

// Visible CUDA devices; 0 when there is no driver, no device, or CUDA_VISIBLE_DEVICES
// hides them all.
int cuda_device_count();

// e.g. "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"; "unavailable: <reason>" when
// the device cannot be queried.
std::string cuda_device_description(int device);

// The CUDA runtime's version, e.g. "13.0".
std::string cuda_runtime_version();

// e.g. "9.0"; empty when the device cannot be queried.
std::string cuda_compute_capability(int device);

}  // namespace scalestudy
