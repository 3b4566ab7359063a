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

// The device as nvidia-smi and NVML name it, so that a result file tells apart GPUs of one
// model, and which physical GPU a rank drove whatever CUDA_VISIBLE_DEVICES renumbered:
// its UUID, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", and its PCI bus id,
// "DDDDDDDD:BB:DD.0" (hexadecimal domain, bus, device). "unavailable: <reason>" when the
// device cannot be queried.
std::string cuda_device_uuid(int device);
std::string cuda_device_pci_bus_id(int device);

// The CUDA runtime's version, e.g. "13.0".
std::string cuda_runtime_version();

}  // namespace scalestudy
