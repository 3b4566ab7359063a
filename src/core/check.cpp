#include "core/check.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace scalestudy {
namespace {

std::atomic<AbortHook> abort_hook{nullptr};
std::atomic<const JobEnder*> job_ender{nullptr};

// The job ender while MPI runs, else nullptr: this process then ends alone.
const JobEnder* mpi_job_ender() {
  const JobEnder* ender = job_ender.load();
  return ender && ender->running() ? ender : nullptr;
}

}  // namespace

void set_job_ender(const JobEnder* ender) { job_ender.store(ender); }

void set_abort_hook(AbortHook hook) { abort_hook.store(hook); }

std::string host_name() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

namespace {

// How long a rank that ends quietly waits for the launcher to tear it down. Exiting at
// once could make the launcher tear down the reporting rank before it has printed its
// line and marked the file failed.
constexpr std::chrono::seconds kQuietEndWait{2};
// How long a second thread that comes to end the process waits for the first to do so.
constexpr std::chrono::seconds kSecondEnderWait{10};

// Ends quietly for the failure another rank reported: the launcher is tearing the job
// down for it, and rank 0's file records that rank's reason.
[[noreturn]] void end_after_notice(const std::string& notice, int exit_code) {
  if (AbortHook hook = abort_hook.exchange(nullptr)) hook(notice);
  // Sleeps in slices: the launcher's SIGTERM interrupts each one, but not the wait.
  const auto deadline = std::chrono::steady_clock::now() + kQuietEndWait;
  while (std::chrono::steady_clock::now() < deadline) usleep(10000);
  std::_Exit(exit_code);
}

// One thread of a process ends it: a second that comes to end it too (the watchdog's
// thread and the main thread both find the same stuck peer, or a stop signal) would
// print a second line. It waits instead, bounded in case the first is itself stuck. The
// first may come again (a check that fails inside the abort hook), and goes on.
void wait_unless_first_to_end() {
  static std::atomic<std::thread::id> ending{std::thread::id()};
  std::thread::id none;
  const std::thread::id me = std::this_thread::get_id();
  if (ending.compare_exchange_strong(none, me) || none == me) return;
  std::this_thread::sleep_for(kSecondEnderWait);
}

// Prints "scalestudy: rank R on HOST: LOCATION" + message, lets the abort hook record
// `reason`, and ends the job with exit_code.
[[noreturn]] void end_job_with(const std::string& location, const std::string& message,
                               const std::string& reason, int exit_code) {
  wait_unless_first_to_end();
  const JobEnder* const mpi = mpi_job_ender();
  if (mpi) {
    // Another rank ended the job first and said why: this rank is being torn down for
    // that reason.
    if (const std::string first = mpi->take_notice(); !first.empty()) end_after_notice(first, exit_code);
    mpi->send_notice(reason);
  }
  const int rank = mpi ? mpi->rank() : -1;
  std::fprintf(stderr, "scalestudy: rank %d on %s: %s%s\n", rank, host_name().c_str(),
               location.c_str(), message.c_str());
  std::fflush(stderr);
  // exchange() so that a failure inside the hook cannot run it again.
  if (AbortHook hook = abort_hook.exchange(nullptr)) hook(reason);
  if (mpi) mpi->abort(exit_code);
  std::_Exit(exit_code);
}

}  // namespace

void abort_job(const char* file, int line, const std::string& what, const std::string& detail,
               int exit_code) {
  end_job_with(std::string(file) + ":" + std::to_string(line) + ": ", what + ": " + detail,
               what + ": " + detail, exit_code);
}

void end_job(const std::string& reason, int exit_code) { end_job_with("", reason, reason, exit_code); }

void end_job_quietly(const std::string& reason, int exit_code) {
  wait_unless_first_to_end();
  end_after_notice(reason, exit_code);
}

void defer_to_reporting_rank(std::chrono::milliseconds grace) {
  const JobEnder* const mpi = mpi_job_ender();
  if (!mpi) return;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  do {
    if (const std::string notice = mpi->take_notice(); !notice.empty()) end_after_notice(notice, 1);
    usleep(10000);
  } while (std::chrono::steady_clock::now() < deadline);
}

}  // namespace scalestudy
