#pragma once
// NCCL's check: a failed call ends the job (core/check.h) with NCCL's own message and its
// last error's text, which says what failed where NCCL's log may be captured
// (comm/nccl_transport.h) and its warnings not yet shown.
#include <nccl.h>

#include <string>

#include "core/check.h"

namespace scalestudy {
inline std::string nccl_error_text(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) text += std::string(": ") + last;
  return text;
}
}  // namespace scalestudy

#define CHECK_NCCL(call) SCALESTUDY_CHECK_RESULT(call, ncclSuccess, ::scalestudy::nccl_error_text)
