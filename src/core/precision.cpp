#include "core/precision.h"

namespace scalestudy {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::bf16: return "bf16";
    case Precision::fp16: return "fp16";
  }
  return "?";
}

const char* gemm_algos_name(GemmAlgos algos) {
  return algos == GemmAlgos::timed ? "timed" : "heuristic";
}

}  // namespace scalestudy
