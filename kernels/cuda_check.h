#pragma once
// The CUDA runtime's and cuBLAS's checks: a failed call ends the job (check.h) with
// the library's own message.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "check.h"

#define CHECK_CUDA(call) SCALESTUDY_CHECK_RESULT(call, cudaSuccess, cudaGetErrorString)
#define CHECK_CUBLAS(call) SCALESTUDY_CHECK_RESULT(call, CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
