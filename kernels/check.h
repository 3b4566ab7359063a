#pragma once
// The kernels' generic check. kernels/ includes nothing from src/: a failed check ends the
// job through abort_job, which the ground library (scalestudy_core, core/check.cpp) defines
// and scalestudy_kernels links without taking its headers. The two macros are token for
// token those of core/check.h, so that a file that sees both compiles, and one that drifts
// is a compile error (a macro redefined differently).
#include <string>

// Declared once per file whichever of kernels/check.h and core/check.h comes first (a
// default argument may be given once).
#ifndef SCALESTUDY_ABORT_JOB_DECLARED
#define SCALESTUDY_ABORT_JOB_DECLARED
namespace scalestudy {
[[noreturn]] void abort_job(const char* file, int line, const std::string& what, const std::string& detail,
                            int exit_code = 1);
}  // namespace scalestudy
#endif

#define SCALESTUDY_CHECK(cond, detail)                                                   \
  do {                                                                                   \
    if (!(cond)) ::scalestudy::abort_job(__FILE__, __LINE__, "check failed: " #cond, (detail), 1); \
  } while (0)

#define SCALESTUDY_CHECK_RESULT(call, success, describe)                                 \
  do {                                                                                   \
    const auto check_result_ = (call);                                                   \
    if (check_result_ != (success))                                                      \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, describe(check_result_), 1);    \
  } while (0)
