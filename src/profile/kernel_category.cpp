#include "profile/kernel_category.h"

#include <algorithm>
#include <cctype>

#include "core/enum_names.h"

namespace scalestudy {
namespace {

// Library kernels are recognised by name: NCCL prefixes every kernel with "ncclKernel" or
// "ncclDevKernel", and cuBLAS/cuBLASLt GEMM kernels carry one of these fragments
// (sm90_xmma_gemm_*, cutlass*_gemm*, nvjet_* on Hopper, gemv2T_kernel, splitKreduce_kernel).
constexpr std::array<const char*, 1> kCommunicationPatterns = {"nccl"};
constexpr std::array<const char*, 6> kGemmPatterns = {"gemm", "sm90_xmma", "cutlass", "nvjet", "gemv", "splitk"};

constexpr EnumNames<KernelCategory, kKernelCategoryCount> kKernelCategoryNames{
    {"gemm", "attention", "norm_elementwise", "optimizer", "communication", "memory", "other"}, "other"};
static_assert(kKernelCategoryNames.complete());

constexpr EnumNames<TraceRecordKind, kTraceRecordKindCount> kTraceRecordKindNames{{"kernel", "memcpy", "memset"},
                                                                                  "kernel"};
static_assert(kTraceRecordKindNames.complete());

std::string lower(const std::string& text) {
  std::string out = text;
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

template <size_t N>
bool contains_any(const std::string& lowered, const std::array<const char*, N>& patterns) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const char* pattern) { return lowered.find(pattern) != std::string::npos; });
}

template <size_t N>
std::string quoted_list(const std::array<const char*, N>& patterns) {
  std::string out;
  for (const char* pattern : patterns) out += (out.empty() ? "'" : ", '") + std::string(pattern) + "'";
  return out;
}

}  // namespace

const char* kernel_category_name(KernelCategory category) { return kKernelCategoryNames.name(category); }

std::vector<std::string> kernel_category_names() { return kKernelCategoryNames.all(); }

std::vector<std::string> trace_record_kind_names() { return kTraceRecordKindNames.all(); }

KernelCategory categorize(TraceRecordKind kind, const std::string& name, LaunchTag tag) {
  if (kind != TraceRecordKind::kernel) return KernelCategory::memory;
  const std::string lowered = lower(name);
  if (contains_any(lowered, kCommunicationPatterns)) return KernelCategory::communication;
  if (contains_any(lowered, kGemmPatterns)) return KernelCategory::gemm;
  if (tag.tagged) return tag.category;
  return KernelCategory::other;
}

std::vector<std::string> kernel_category_rules() {
  return {
      "1. kind memcpy or memset -> memory",
      "2. name contains (case-insensitive) " + quoted_list(kCommunicationPatterns) + " -> communication",
      "3. name contains (case-insensitive) any of " + quoted_list(kGemmPatterns) + " -> gemm",
      "4. launched inside a scalestudy op (CUPTI external correlation) -> the op's category",
      "5. otherwise -> other",
  };
}

}  // namespace scalestudy
