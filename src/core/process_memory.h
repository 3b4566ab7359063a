#pragma once
#include <cstddef>

namespace scalestudy {

// The process's peak resident set (VmHWM from /proc/self/status), in bytes; 0 where
// /proc is missing.
size_t peak_resident_bytes();

}  // namespace scalestudy
