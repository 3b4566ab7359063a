#include "core/precision.h"

#include "core/enum_names.h"

namespace scalestudy {

namespace {

constexpr EnumNames<Precision, kPrecisionCount> kPrecisionNames{{"fp32", "bf16", "fp16"}, "?"};
static_assert(kPrecisionNames.complete());

}  // namespace

const char* precision_name(Precision precision) { return kPrecisionNames.name(precision); }

const char* gemm_algos_name(GemmAlgos algos) {
  return algos == GemmAlgos::timed ? "timed" : "heuristic";
}

}  // namespace scalestudy
