#pragma once
// What a traced GPU record was doing, for the kernel profile of --profile-kernels: one
// documented table of rules (kernel_category.cpp, docs/results-schema.md "/kernel_trace")
// turns a record's kind, name and launch tag into a category.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace scalestudy {

enum class KernelCategory : uint8_t {
  gemm,
  attention,
  norm_elementwise,
  optimizer,
  communication,
  memory,
  other,
};
inline constexpr int kKernelCategoryCount = 7;
const char* kernel_category_name(KernelCategory category);
std::vector<std::string> kernel_category_names();

enum class TraceRecordKind : uint8_t { kernel, memcpy, memset };
inline constexpr int kTraceRecordKindCount = 3;
std::vector<std::string> trace_record_kind_names();

// The category a scalestudy op tagged its launches with; none for launches outside ops
// (cuBLAS and NCCL internals, or code that does not tag).
struct LaunchTag {
  bool tagged = false;
  KernelCategory category = KernelCategory::other;
};

// Applies the rules in order; the first that matches decides.
KernelCategory categorize(TraceRecordKind kind, const std::string& name, LaunchTag tag);

// The rules as text, one per line in the order they are tried (written into the trace).
std::vector<std::string> kernel_category_rules();

}  // namespace scalestudy
