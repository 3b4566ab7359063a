#pragma once
// The CUDA runtime's and cuBLAS's checks: a failed call ends the job (core/check.h) with
// the library's own message.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define CHECK_CUDA(call)                                                                 \
  do {                                                                                   \
    cudaError_t check_cuda_rc_ = (call);                                                 \
    if (check_cuda_rc_ != cudaSuccess)                                                   \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, cudaGetErrorString(check_cuda_rc_)); \
  } while (0)

#define CHECK_CUBLAS(call)                                                               \
  do {                                                                                   \
    cublasStatus_t check_cublas_rc_ = (call);                                            \
    if (check_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call,                                 \
                              cublasGetStatusString(check_cublas_rc_));                  \
  } while (0)
