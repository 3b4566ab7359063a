#pragma once
// How every failed check ends the job: it reports rank, host, file:line and the
// library's own message, then aborts the whole job, since a half-failed collective on one
// rank would otherwise leave its peers waiting forever. Before it aborts, the ending rank
// tells every other rank why (a job-end notice), so that the ranks the launcher then tears
// down end quietly instead of each blaming the teardown. The ground links no MPI: where MPI
// runs, the control layer lends it the MPI calls that take part (a JobEnder,
// control/mpi_check.h). This header holds the generic check; each library target that
// calls another library has its own check header on top of abort_job:
// control/mpi_check.h (MPI), kernels/cuda_check.h (CUDA, cuBLAS; kernels/check.h repeats
// the generic macros, since kernels/ includes nothing from src/), comm/nccl_check.h,
// results/hdf5_check.h, and CUPTI's in backend/cuda/cupti_tracer.cpp.
#include <chrono>
#include <string>

// Prints "scalestudy: rank R on HOST: FILE:LINE: WHAT: DETAIL" to stderr and ends the job
// with MPI_Abort (or exit when MPI is not running). Declared once per file whichever of
// kernels/check.h and core/check.h comes first (a default argument may be given once).
#ifndef SCALESTUDY_ABORT_JOB_DECLARED
#define SCALESTUDY_ABORT_JOB_DECLARED
namespace scalestudy {
[[noreturn]] void abort_job(const char* file, int line, const std::string& what, const std::string& detail,
                            int exit_code = 1);
}  // namespace scalestudy
#endif

namespace scalestudy {

// Ends the job for a reason that is no program error (a signal, a peer that never came):
// "scalestudy: rank R on HOST: REASON" on stderr, the abort hook, then MPI_Abort.
[[noreturn]] void end_job(const std::string& reason, int exit_code);

// For a rank that is not the one to report a failure that its peers see too (a roll call,
// control/roll_call.h, names a lower rank that responds): waits up to `grace` for the notice
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

// The MPI calls by which the job ends where MPI runs: control/mpi_check.cpp fills it in,
// and MpiRuntime installs it before MPI starts. Without one, or while `running` says no,
// a failed check ends this process alone and names rank -1.
struct JobEnder {
  bool (*running)();                              // MPI is initialized and not finalized
  int (*rank)();                                  // this process's rank in the world
  void (*send_notice)(const std::string& reason); // tells every other rank, once
  std::string (*take_notice)();                   // "rank R: REASON" another rank sent, or ""
  void (*abort)(int exit_code);                   // ends the whole job; does not return
};
void set_job_ender(const JobEnder* ender);

// This machine's hostname, as failed checks and result files name it.
std::string host_name();

}  // namespace scalestudy

#define SCALESTUDY_CHECK(cond, detail)                                                   \
  do {                                                                                   \
    if (!(cond)) ::scalestudy::abort_job(__FILE__, __LINE__, "check failed: " #cond, (detail), 1); \
  } while (0)

// Evaluates `call` once; where its result is not `success`, ends the job with the message
// that describe(result) gives. Every library's check is this one with its own success
// value and message function.
#define SCALESTUDY_CHECK_RESULT(call, success, describe)                                 \
  do {                                                                                   \
    const auto check_result_ = (call);                                                   \
    if (check_result_ != (success))                                                      \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, describe(check_result_), 1);    \
  } while (0)
