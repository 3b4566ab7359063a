#pragma once
// How a run computes: the number format of the activations and GEMMs, how cuBLASLt's
// GEMM algorithms are chosen, and which kernels compute the attention. Shared by the
// configuration, the backends and the kernels.
#include "core/enum_names.h"

namespace scalestudy {

// fp32 everywhere, or 16-bit activations and GEMMs with fp32 master weights.
enum class Precision { fp32, bf16, fp16 };
inline constexpr int kPrecisionCount = 3;
inline constexpr EnumNames<Precision, kPrecisionCount> kPrecisionNames{{"fp32", "bf16", "fp16"}, "?"};
static_assert(kPrecisionNames.complete());
inline const char* precision_name(Precision precision) { return kPrecisionNames.name(precision); }
inline bool is_16bit(Precision precision) {
  return precision == Precision::bf16 || precision == Precision::fp16;
}

// How cuda picks the algorithm of each 16-bit GEMM with a cuBLASLt epilogue: heuristic,
// cuBLASLt's first, the same on every run; timed, also cuBLASLt's first for fewer
// multiprocessors where it times clearly faster in the run's first step
// (kernels/gemm_lt.cuh). A choice file (--gemm-algos-file) names algorithms that win over
// both.
enum class GemmAlgos { heuristic, timed };
inline const char* gemm_algos_name(GemmAlgos algos) { return algos == GemmAlgos::timed ? "timed" : "heuristic"; }

// Which kernels compute the attention of cuda's bf16 and fp16 modes: flash, the project's
// own (kernels/flash_attention.cuh), or cudnn, cuDNN's fused scaled-dot-product attention
// through its graph API (backend/cuda/cudnn_attention.h), with libcudnn opened at run time.
// auto is chosen by the machine (resolve_attention_kernel). fp32 and the cpu backend
// always keep the probabilities in memory (the unfused path), whatever is asked.
enum class AttentionKernel { auto_select, flash, cudnn };
inline constexpr int kAttentionKernelCount = 3;
inline constexpr EnumNames<AttentionKernel, kAttentionKernelCount> kAttentionKernelNames{
    {"auto", "flash", "cudnn"}, "?"};
static_assert(kAttentionKernelNames.complete());
inline const char* attention_kernel_name(AttentionKernel kernel) { return kAttentionKernelNames.name(kernel); }
// What `requested` resolves to where the machine is not asked: auto is flash. A run on cuda
// asks it first (cli/backend_setup.h, choose_attention_kernel), and there auto is cudnn in
// bf16 wherever libcudnn 9 loads.
inline AttentionKernel resolve_attention_kernel(AttentionKernel requested) {
  return requested == AttentionKernel::auto_select ? AttentionKernel::flash : requested;
}
// The attention a run computes with, as result files record it: "flash" or "cudnn" in the
// 16-bit modes of cuda, "unfused" in fp32 and on the cpu backend. A shape that the fused
// kernels do not take (kernels/flash_attention.cuh, cudnn_attention.h) runs unfused too.
inline const char* attention_kernel_used(AttentionKernel requested, bool cuda, Precision precision) {
  if (!cuda || !is_16bit(precision)) return "unfused";
  return attention_kernel_name(resolve_attention_kernel(requested));
}

}  // namespace scalestudy
