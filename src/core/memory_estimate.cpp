#include "core/memory_estimate.h"

#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "core/enum_names.h"

namespace scalestudy {

namespace {

// The names are the ones the results file and the memory report use as keys, so they
// must stay stable across versions.
constexpr EnumNames<MemoryKind, kMemoryKindCount> kMemoryKindNames{
    {"parameters", "gradients", "optimizer", "activations", "communication", "other"}, "unknown"};
static_assert(kMemoryKindNames.complete());

}  // namespace

const char* memory_kind_name(MemoryKind kind) { return kMemoryKindNames.name(kind); }

size_t MemoryEstimate::total_bytes() const {
  size_t total = 0;
  for (size_t kind_bytes : bytes) total += kind_bytes;
  return total;
}

std::string MemoryEstimate::describe() const {
  std::string text;
  for (int k = 0; k < kMemoryKindCount; ++k) {
    if (bytes[static_cast<size_t>(k)] == 0) continue;
    if (!text.empty()) text += ", ";
    text += std::string(memory_kind_name(static_cast<MemoryKind>(k))) + " " + human_bytes(bytes[static_cast<size_t>(k)]);
  }
  return text.empty() ? "nothing" : text;
}

size_t memory_with_headroom(size_t predicted_bytes) {
  constexpr size_t kFixedHeadroomBytes = size_t{128} << 20;
  return predicted_bytes + predicted_bytes / 20 + kFixedHeadroomBytes;
}

std::string human_bytes(size_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), value >= 100.0 ? "%.0f %s" : value >= 10.0 ? "%.1f %s" : "%.2f %s", value,
                kUnits[unit]);
  return text;
}

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

namespace {

// What a kind's allocation holds, as the message names it: "other" is the backends' own
// scratch and workspaces.
std::string allocation_name(MemoryKind kind) {
  return kind == MemoryKind::other ? "backend scratch" : memory_kind_name(kind);
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(MemoryKind kind, size_t bytes, const std::string& where,
                                   const std::string& detail)
    : std::runtime_error("out of memory while allocating " + allocation_name(kind) + " (" +
                         human_bytes(bytes) + ", " + where + (detail.empty() ? "" : "; " + detail) + ")"),
      kind_(kind),
      bytes_(bytes) {}

OutOfMemoryError::OutOfMemoryError(const OutOfMemoryError& cause, const std::string& when)
    : std::runtime_error(std::string(cause.what()) + " " + when), kind_(cause.kind_), bytes_(cause.bytes_) {}

}  // namespace scalestudy
