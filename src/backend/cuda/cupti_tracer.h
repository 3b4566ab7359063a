#pragma once
// The CUDA backend's KernelTracer: CUPTI's activity API, with libcupti opened by dlopen
// when the first tracer is made, so that a run without --profile-kernels never loads it.
// It records concurrent kernels, memcpys and memsets; the CUDA runtime API records and
// the external correlation records are read only to match each launch with the
// ScopedKernelTag its op opened (kernel_tag.h). One tracer at a time per process.
#include <memory>
#include <string>

#include "profile/kernel_trace.h"

namespace scalestudy {

// Aborts with the names it tried when libcupti cannot be loaded. `device_name` is stored
// in the trace.
std::unique_ptr<KernelTracer> make_cupti_tracer(const std::string& device_name);

// Whether libcupti is mapped into this process (read from /proc/self/maps): the tests
// check that nothing loads it without a tracer.
bool cupti_library_loaded();

}  // namespace scalestudy
