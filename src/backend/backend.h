#pragma once
// A backend: the math of the model (Ops), the memory it works in (DeviceMemory) and its
// device's services (DeviceServices), implemented together by CpuOps and CudaOps because
// they share one device and one compute stream. The model, the strategies and the
// trainer hold a Backend; a function that needs only one part takes only that part.
#include <string>

#include "backend/device_memory.h"
#include "backend/device_services.h"
#include "backend/ops.h"

namespace scalestudy {

class Backend : public Ops, public DeviceMemory, public DeviceServices {
 public:
  // A backend owns its device's memory and streams: it is never copied.
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  // "cpu" or "cuda".
  virtual std::string name() const = 0;
};

}  // namespace scalestudy
