#include "backend/cuda/device_info.h"

#include <cuda_runtime.h>

#include "cuda_check.h"

#include <cstdio>

namespace scalestudy {
namespace {

// Failures here are answers ("no GPU"), not errors, so they are never passed to
// CHECK_CUDA. The runtime records the last error per thread; it is read back here so a
// failed query does not surface later at an unrelated cudaGetLastError launch check.
bool query_properties(int device, cudaDeviceProp& props, std::string& reason) {
  if (device < 0 || device >= cuda_device_count()) {
    reason = "no CUDA device " + std::to_string(device);
    return false;
  }
  const cudaError_t rc = cudaGetDeviceProperties(&props, device);
  if (rc != cudaSuccess) {
    reason = cudaGetErrorString(rc);
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// describe(props) for the device, or "unavailable: <reason>" when it cannot be queried.
template <typename Describe>
std::string describe_device(int device, Describe describe) {
  cudaDeviceProp props{};
  std::string reason;
  if (!query_properties(device, props, reason)) return "unavailable: " + reason;
  return describe(props);
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::string cuda_device_description(int device) {
  return describe_device(device, [](const cudaDeviceProp& props) {
    char text[512];
    std::snprintf(text, sizeof(text), "%s (sm_%d%d, %d SMs, %.1f GiB)", props.name, props.major,
                  props.minor, props.multiProcessorCount,
                  static_cast<double>(props.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    return std::string(text);
  });
}

std::string cuda_device_uuid(int device) {
  return describe_device(device, [](const cudaDeviceProp& props) {
    // 16 bytes in nvidia-smi's groups of 4, 2, 2, 2 and 6.
    std::string text = "GPU-";
    char hex[3];
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
      std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(props.uuid.bytes[i]));
      text += hex;
    }
    return text;
  });
}

std::string cuda_device_pci_bus_id(int device) {
  return describe_device(device, [](const cudaDeviceProp& props) {
    char text[32];
    std::snprintf(text, sizeof(text), "%08X:%02X:%02X.0", static_cast<unsigned>(props.pciDomainID),
                  static_cast<unsigned>(props.pciBusID), static_cast<unsigned>(props.pciDeviceID));
    return std::string(text);
  });
}

std::string cuda_runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return "unknown";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

}  // namespace scalestudy
