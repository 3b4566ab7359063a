#include "op_params.h"

#include <string>

#include "check.h"

namespace scalestudy {
namespace {

void check_positive(int value, const char* what) {
  SCALESTUDY_CHECK(value > 0, std::string(what) + " must be positive, got " +
                                  std::to_string(value));
}

}  // namespace

void check_row_stride(int stride, int channels, const char* what) {
  SCALESTUDY_CHECK(stride == 0 || stride >= channels + kAugmentedColumns,
                   std::string(what) + " row stride " + std::to_string(stride) +
                       " must be 0 or at least its " + std::to_string(channels) + " channels + " +
                       std::to_string(kAugmentedColumns));
}

int attention_head_size(const AttentionShape& shape) {
  check_positive(shape.batch, "attention batch");
  check_positive(shape.seq, "attention seq");
  check_positive(shape.heads, "attention heads");
  SCALESTUDY_CHECK(shape.channels > 0 && shape.channels % shape.heads == 0,
                   "attention channels " + std::to_string(shape.channels) +
                       " must be a positive multiple of heads " + std::to_string(shape.heads));
  return shape.channels / shape.heads;
}

}  // namespace scalestudy
