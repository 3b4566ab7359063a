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
  cudaDeviceProp props{};
  std::string reason;
  if (!query_properties(device, props, reason)) return "unavailable: " + reason;
  char text[512];
  std::snprintf(text, sizeof(text), "%s (sm_%d%d, %d SMs, %.1f GiB)", props.name, props.major,
                props.minor, props.multiProcessorCount,
                static_cast<double>(props.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

std::string cuda_compute_capability(int device) {
  cudaDeviceProp props{};
  std::string reason;
  if (!query_properties(device, props, reason)) return "";
  return std::to_string(props.major) + "." + std::to_string(props.minor);
}

std::string cuda_runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return "unknown";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

}  // namespace scalestudy
