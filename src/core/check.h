#pragma once
// How every failed check ends the job: it reports rank, host, file:line and the
// library's own message, then aborts the whole job, since a half-failed collective on one
// rank would otherwise leave its peers waiting forever. Before it aborts, the ending rank
// tells every other rank why (a job-end notice), so that the ranks the launcher then tears
// down end quietly instead of each blaming the teardown. This header holds the generic
// check and MPI's; each library target that calls another library has its own check
// header on top of abort_job: kernels/cuda_check.h (CUDA, cuBLAS), comm/nccl_check.h,
// results/hdf5_check.h, and CUPTI's in backend/cuda/cupti_tracer.cpp.
#include <mpi.h>

#include <chrono>
#include <string>

namespace scalestudy {

// Prints "scalestudy: rank R on HOST: FILE:LINE: WHAT: DETAIL" to stderr and ends the job
// with MPI_Abort (or exit when MPI is not running).
[[noreturn]] void abort_job(const char* file, int line, const std::string& what,
                            const std::string& detail, int exit_code = 1);

// Ends the job for a reason that is no program error (a signal, a peer that never came):
// "scalestudy: rank R on HOST: REASON" on stderr, the abort hook, then MPI_Abort.
[[noreturn]] void end_job(const std::string& reason, int exit_code);

// For a rank that is not the one to report a failure that its peers see too (a roll call,
// core/roll_call.h, names a lower rank that responds): waits up to `grace` for the notice
// that the rank ending the job sends every other rank before it aborts. On one, this rank
// ends quietly, and the abort hook records the notice's reason. Returns when none came.
void defer_to_reporting_rank(std::chrono::milliseconds grace);

// Ends this rank without a line of its own, for a failure that another rank reports: the
// abort hook records `reason`, and the process exits with exit_code once the launcher has
// had the time to tear the job down.
[[noreturn]] void end_job_quietly(const std::string& reason, int exit_code);

// Called once, on the aborting rank, before the job is ended: the results writer marks
// its file failed here. Pass nullptr to remove it.
using AbortHook = void (*)(const std::string& reason);
void set_abort_hook(AbortHook hook);

std::string mpi_error_string(int code);
// This machine's hostname, as failed checks and result files name it.
std::string host_name();

}  // namespace scalestudy

#define SCALESTUDY_CHECK(cond, detail)                                                   \
  do {                                                                                   \
    if (!(cond)) ::scalestudy::abort_job(__FILE__, __LINE__, "check failed: " #cond, (detail)); \
  } while (0)

// Evaluates `call` once; where its result is not `success`, ends the job with the message
// that describe(result) gives. Every library's check is this one with its own success
// value and message function.
#define SCALESTUDY_CHECK_RESULT(call, success, describe)                                 \
  do {                                                                                   \
    const auto check_result_ = (call);                                                   \
    if (check_result_ != (success))                                                      \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, describe(check_result_));       \
  } while (0)

#define CHECK_MPI(call) SCALESTUDY_CHECK_RESULT(call, MPI_SUCCESS, ::scalestudy::mpi_error_string)
