#include "core/process_memory.h"

#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

namespace scalestudy {
namespace {

// The value of the "KEY:   N kB" line of a /proc file, in bytes, where there is one.
std::optional<size_t> proc_kib_field(const char* path, const std::string& key) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    size_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

size_t peak_resident_bytes() { return proc_kib_field("/proc/self/status", "VmHWM").value_or(0); }

size_t host_available_bytes() {
  return proc_kib_field("/proc/meminfo", "MemAvailable").value_or(std::numeric_limits<size_t>::max());
}

}  // namespace scalestudy
