#include "core/check.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace scalestudy {
namespace {

std::atomic<AbortHook> abort_hook{nullptr};

}  // namespace

void set_abort_hook(AbortHook hook) { abort_hook.store(hook); }

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

std::string mpi_error_string(int code) {
  std::vector<char> text(MPI_MAX_ERROR_STRING, '\0');
  int length = 0;
  if (MPI_Error_string(code, text.data(), &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text.data(), static_cast<size_t>(length));
}

namespace {

// Prints "scalestudy: rank R on HOST: LOCATION" + message, lets the abort hook record
// `reason`, and ends the job with exit_code.
[[noreturn]] void end_job_with(const std::string& location, const std::string& message,
                               const std::string& reason, int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = -1;
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "scalestudy: rank %d on %s: %s%s\n", rank, host_name().c_str(),
               location.c_str(), message.c_str());
  std::fflush(stderr);
  // exchange() so that a failure inside the hook cannot run it again.
  if (AbortHook hook = abort_hook.exchange(nullptr)) hook(reason);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace

void abort_job(const char* file, int line, const std::string& what, const std::string& detail,
               int exit_code) {
  end_job_with(std::string(file) + ":" + std::to_string(line) + ": ", what + ": " + detail,
               what + ": " + detail, exit_code);
}

void end_job(const std::string& reason, int exit_code) { end_job_with("", reason, reason, exit_code); }

}  // namespace scalestudy
