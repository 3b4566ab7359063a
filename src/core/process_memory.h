#pragma once
// The host memory of this process: its peak, and what new allocations may still take.
#include <cstddef>

namespace scalestudy {

// The process's peak resident set (VmHWM from /proc/self/status), in bytes; 0 where
// /proc is missing.
size_t peak_resident_bytes();

// The host's MemAvailable (/proc/meminfo), in bytes: what new allocations may take
// without swapping, shared by every process of the host. SIZE_MAX where /proc is
// missing, so that nothing is refused for want of a number.
size_t host_available_bytes();

}  // namespace scalestudy
