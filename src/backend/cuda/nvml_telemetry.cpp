#include "backend/cuda/nvml_telemetry.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/dynamic_symbol.h"
#include "cuda_check.h"

namespace scalestudy {
namespace {

// The part of NVML's C ABI used here (nvml.h of the CUDA Toolkit and the driver): return
// codes are ints, 0 for success; a device is an opaque pointer.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;           // nvmlClockType_t NVML_CLOCK_SM
constexpr int kNvmlTemperatureGpu = 0;    // nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU
constexpr unsigned kFieldPowerInstant = 186;  // NVML_FI_DEV_POWER_INSTANT, milliwatts
constexpr int kValueTypeUnsignedInt = 1;  // nvmlValueType_t NVML_VALUE_TYPE_UNSIGNED_INT

// nvmlFieldValue_t.
struct NvmlFieldValue {
  unsigned field_id;
  unsigned scope_id;
  long long timestamp;
  long long latency_us;
  int value_type;
  NvmlReturn result;
  union {
    double as_double;
    unsigned as_unsigned;
    unsigned long as_unsigned_long;
    unsigned long long as_unsigned_long_long;
    long long as_long_long;
  } value;
};

struct NvmlApi {
  NvmlReturn (*init)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*clock_info)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*temperature)(NvmlDevice, int, unsigned*) = nullptr;
  NvmlReturn (*field_values)(NvmlDevice, int, NvmlFieldValue*) = nullptr;
  NvmlReturn (*clock_event_reasons)(NvmlDevice, unsigned long long*) = nullptr;
};

// Opened and initialised once, and kept for the process's life.
const NvmlApi* nvml(std::string& why_not) {
  static std::string failure;
  static const NvmlApi* api = []() -> const NvmlApi* {
    void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      failure = std::string("libnvidia-ml.so.1 could not be loaded: ") + dlerror();
      return nullptr;
    }
    static NvmlApi loaded;
    const bool complete = load_symbol(library, "nvmlInit_v2", loaded.init) &&
                          load_symbol(library, "nvmlErrorString", loaded.error_string) &&
                          load_symbol(library, "nvmlDeviceGetHandleByPciBusId_v2", loaded.handle_by_pci_bus_id) &&
                          load_symbol(library, "nvmlDeviceGetClockInfo", loaded.clock_info) &&
                          load_symbol(library, "nvmlDeviceGetTemperature", loaded.temperature) &&
                          load_symbol(library, "nvmlDeviceGetFieldValues", loaded.field_values);
    if (!complete) {
      failure = "libnvidia-ml.so.1 lacks an entry point this build uses";
      return nullptr;
    }
    // Drivers from R535 on name it "event"; older ones only "throttle".
    if (!load_symbol(library, "nvmlDeviceGetCurrentClocksEventReasons", loaded.clock_event_reasons))
      load_symbol(library, "nvmlDeviceGetCurrentClocksThrottleReasons", loaded.clock_event_reasons);
    if (const NvmlReturn result = loaded.init(); result != kNvmlSuccess) {
      failure = std::string("nvmlInit_v2: ") + loaded.error_string(result);
      return nullptr;
    }
    return &loaded;
  }();
  if (!api) why_not = failure;
  return api;
}

class NvmlTelemetry final : public GpuTelemetry {
 public:
  NvmlTelemetry(const NvmlApi& api, NvmlDevice device, std::chrono::milliseconds period)
      : api_(api), device_(device), period_(period), thread_([this] { run(); }) {}

  ~NvmlTelemetry() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  std::vector<GpuSample> take_samples() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(samples_, {});
  }

 private:
  GpuSample sample() const {
    GpuSample s;
    s.taken_at = std::chrono::steady_clock::now();
    unsigned value = 0;
    if (api_.clock_info(device_, kNvmlClockSm, &value) == kNvmlSuccess) s.sm_clock_mhz = value;
    if (api_.temperature(device_, kNvmlTemperatureGpu, &value) == kNvmlSuccess) s.temperature_c = value;
    NvmlFieldValue power{};
    power.field_id = kFieldPowerInstant;
    if (api_.field_values(device_, 1, &power) == kNvmlSuccess && power.result == kNvmlSuccess &&
        power.value_type == kValueTypeUnsignedInt)
      s.power_w = power.value.as_unsigned / 1000.0;
    unsigned long long reasons = 0;
    if (api_.clock_event_reasons && api_.clock_event_reasons(device_, &reasons) == kNvmlSuccess) {
      s.has_clock_event_reasons = true;
      s.clock_event_reasons = static_cast<int64_t>(reasons);
    }
    return s;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      const GpuSample s = sample();
      lock.lock();
      samples_.push_back(s);
      wake_.wait_for(lock, period_, [this] { return stopping_; });
    }
  }

  const NvmlApi& api_;
  NvmlDevice device_;
  std::chrono::milliseconds period_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<GpuSample> samples_;
  std::thread thread_;  // last: it starts once the members it uses exist
};

}  // namespace

std::unique_ptr<GpuTelemetry> make_nvml_telemetry(int device, std::chrono::milliseconds period,
                                                  std::string& why_not) {
  const NvmlApi* api = nvml(why_not);
  if (!api) return nullptr;
  char bus_id[32] = {};
  CHECK_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device));
  NvmlDevice handle = nullptr;
  if (const NvmlReturn result = api->handle_by_pci_bus_id(bus_id, &handle); result != kNvmlSuccess) {
    why_not = std::string("nvmlDeviceGetHandleByPciBusId_v2(") + bus_id + "): " + api->error_string(result);
    return nullptr;
  }
  return std::make_unique<NvmlTelemetry>(*api, handle, period);
}

}  // namespace scalestudy
