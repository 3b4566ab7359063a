#pragma once
// NCCL's check: a failed call ends the job (core/check.h) with NCCL's own message.
#include <nccl.h>

#include "core/check.h"

#define CHECK_NCCL(call) SCALESTUDY_CHECK_RESULT(call, ncclSuccess, ncclGetErrorString)
