#pragma once
// How a run computes: the number format of the activations and GEMMs, and how cuBLASLt's
// GEMM algorithms are chosen. Shared by the configuration, the backends and the kernels.
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

// How cuda picks each cuBLASLt GEMM's algorithm: the heuristic's first, the same on every
// run, or also the heuristic's first for fewer multiprocessors where it times clearly
// faster in the run's first step (kernels/gemm_lt.cuh).
enum class GemmAlgos { heuristic, timed };
inline const char* gemm_algos_name(GemmAlgos algos) {
  return algos == GemmAlgos::timed ? "timed" : "heuristic";
}

}  // namespace scalestudy
