#pragma once
// NCCL's check: a failed call ends the job (core/check.h) with NCCL's own message.
#include <nccl.h>

#include "core/check.h"

#define CHECK_NCCL(call)                                                                 \
  do {                                                                                   \
    ncclResult_t check_nccl_rc_ = (call);                                                \
    if (check_nccl_rc_ != ncclSuccess)                                                   \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, ncclGetErrorString(check_nccl_rc_)); \
  } while (0)
