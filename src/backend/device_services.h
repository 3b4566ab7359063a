#pragma once
// What a backend's device offers besides its ops and its memory: waiting for its compute
// stream, timing and tracing the work on it, and sharing its multiprocessors with
// communication.
#include <memory>
#include <string>
#include <vector>

#include "profile/kernel_trace.h"
#include "timing/step_timer.h"

namespace scalestudy {

class DeviceServices {
 public:
  virtual ~DeviceServices() = default;

  // Whether ops return before their work is done (a device stream runs it), so that host
  // work between them runs beside it.
  virtual bool runs_asynchronously() const = 0;
  // Waits until every op issued so far has finished (a no-op on the CPU).
  virtual void synchronize() = 0;

  // A timer of the compute stream, for phase intervals.
  virtual std::unique_ptr<StepTimer> make_step_timer() = 0;
  // A tracer of the kernels this backend runs (--profile-kernels), with the compute
  // stream named; nullptr when the backend has no kernels to trace (the CPU).
  virtual std::unique_ptr<KernelTracer> make_kernel_tracer() { return nullptr; }
  // One line per library algorithm this backend chose (cuda: its cuBLASLt GEMMs with an
  // epilogue, and how each algorithm was picked); empty where it chose none.
  virtual std::vector<std::string> algorithm_choices() const { return {}; }

  // From now on, communication kernels may run beside this backend's on up to `count` of
  // the device's multiprocessors (0: none). A backend may size its kernels for the rest
  // (the CUDA backend: its GEMMs, through cuBLAS's SM count target).
  virtual void reserve_multiprocessors(int count) { (void)count; }
};

}  // namespace scalestudy
