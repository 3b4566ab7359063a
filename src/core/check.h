#pragma once
// One checking macro per library. Each failure reports rank, host, file:line and the
// library's own message, then aborts the whole job: a half-failed collective on one
// rank would otherwise leave its peers waiting forever.
#include <mpi.h>
#include <hdf5.h>

#include <string>

#if SCALESTUDY_HAVE_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace scalestudy {

// Prints "scalestudy: rank R on HOST: FILE:LINE: WHAT: DETAIL" to stderr and ends the job
// with MPI_Abort (or exit when MPI is not running).
[[noreturn]] void abort_job(const char* file, int line, const std::string& what,
                            const std::string& detail, int exit_code = 1);

// Called once, on the aborting rank, before the job is ended: the results writer marks
// its file failed here. Pass nullptr to remove it.
using AbortHook = void (*)(const std::string& reason);
void set_abort_hook(AbortHook hook);

std::string mpi_error_string(int code);
std::string hdf5_error_string();
#if SCALESTUDY_HAVE_CUDA
// CUPTI's own message for a CUptiResult (CUPTI is loaded at run time, only by the kernel
// tracer: src/backend/cuda/cupti_tracer.cpp).
std::string cupti_error_string(int code);
#endif

}  // namespace scalestudy

#define SCALESTUDY_CHECK(cond, detail)                                                   \
  do {                                                                                   \
    if (!(cond)) ::scalestudy::abort_job(__FILE__, __LINE__, "check failed: " #cond, (detail)); \
  } while (0)

#define CHECK_MPI(call)                                                                  \
  do {                                                                                   \
    int check_mpi_rc_ = (call);                                                          \
    if (check_mpi_rc_ != MPI_SUCCESS)                                                    \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call,                                 \
                              ::scalestudy::mpi_error_string(check_mpi_rc_));            \
  } while (0)

// HDF5 calls return a negative herr_t or hid_t on failure; the value is passed through.
#define CHECK_HDF5(call)                                                                 \
  ([&]() {                                                                               \
    auto check_hdf5_rc_ = (call);                                                        \
    if (check_hdf5_rc_ < 0)                                                              \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, ::scalestudy::hdf5_error_string()); \
    return check_hdf5_rc_;                                                               \
  }())

#if SCALESTUDY_HAVE_CUDA
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

#define CHECK_NCCL(call)                                                                 \
  do {                                                                                   \
    ncclResult_t check_nccl_rc_ = (call);                                                \
    if (check_nccl_rc_ != ncclSuccess)                                                   \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, ncclGetErrorString(check_nccl_rc_)); \
  } while (0)

// CUPTI_SUCCESS is 0.
#define CHECK_CUPTI(call)                                                                \
  do {                                                                                   \
    int check_cupti_rc_ = static_cast<int>(call);                                        \
    if (check_cupti_rc_ != 0)                                                            \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call,                                 \
                              ::scalestudy::cupti_error_string(check_cupti_rc_));        \
  } while (0)
#endif
