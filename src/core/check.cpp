#include "core/check.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
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

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// The rank that ends the job tells the others first. The launcher then tears them down with
// SIGTERM, and each would otherwise report that signal as its own reason: the user would
// read one line per rank, the first of them naming the real cause and the rest misleading.
// A rank that finds a notice when it ends ends quietly, and rank 0 marks the result file
// failed with the reason that the notice carries.
//
// The notice is a point-to-point message on MPI_COMM_WORLD (tag kJobEndNoticeTag), sent
// without waiting: the sender is about to abort, and a stopped peer never receives it.
//
// The MPI calls here run while the job is being ended, often from inside a failed check:
// their errors are not checked, since a check would end the job again from within this
// one. A notice that fails to go out leaves the other ranks to report for themselves.

constexpr int kJobEndNoticeTag = 32003;  // after roll_call.h's tags

// The longest the sender drives its notices before it goes on to abort the job.
constexpr std::chrono::milliseconds kSendTime{200};

// Sends `reason` to every other rank, once per process; later calls send nothing.
void send_job_end_notice(const std::string& reason) {
  static std::atomic<bool> sent{false};
  if (sent.exchange(true)) return;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Never freed: a send to a stopped rank stays in flight until the job ends.
  const auto* const text = new std::string(reason);
  std::vector<MPI_Request> sends;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    MPI_Request request;
    if (MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, peer, kJobEndNoticeTag, MPI_COMM_WORLD,
                  &request) == MPI_SUCCESS)
      sends.push_back(request);
  }
  // An MPI library may leave a send for its progress engine to make (Open MPI does where
  // another thread holds the transport), and the job is about to be aborted: the sends
  // are driven here until they have left, or for kSendTime where a peer takes none.
  const auto deadline = std::chrono::steady_clock::now() + kSendTime;
  int all_sent = 0;
  while (!all_sent && std::chrono::steady_clock::now() < deadline) {
    if (MPI_Testall(static_cast<int>(sends.size()), sends.data(), &all_sent, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      break;
    if (!all_sent) usleep(1000);
  }
  for (MPI_Request& request : sends)
    if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
}

// The first notice that another rank sent, as "rank R: REASON", or "" when none has come.
std::string take_job_end_notice() {
  int found = 0;
  MPI_Message message;
  MPI_Status status;
  if (MPI_Improbe(MPI_ANY_SOURCE, kJobEndNoticeTag, MPI_COMM_WORLD, &found, &message, &status) != MPI_SUCCESS ||
      !found)
    return "";
  int chars = 0;
  MPI_Get_count(&status, MPI_CHAR, &chars);
  std::string reason(static_cast<size_t>(chars > 0 ? chars : 0), '\0');
  if (MPI_Mrecv(reason.data(), chars, MPI_CHAR, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS) return "";
  return "rank " + std::to_string(status.MPI_SOURCE) + ": " + reason;
}

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
  const bool with_mpi = mpi_running();
  if (with_mpi) {
    // Another rank ended the job first and said why: this rank is being torn down for
    // that reason.
    if (const std::string first = take_job_end_notice(); !first.empty()) end_after_notice(first, exit_code);
    send_job_end_notice(reason);
  }
  int rank = -1;
  if (with_mpi) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "scalestudy: rank %d on %s: %s%s\n", rank, host_name().c_str(),
               location.c_str(), message.c_str());
  std::fflush(stderr);
  // exchange() so that a failure inside the hook cannot run it again.
  if (AbortHook hook = abort_hook.exchange(nullptr)) hook(reason);
  if (with_mpi) MPI_Abort(MPI_COMM_WORLD, exit_code);
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
  if (!mpi_running()) return;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  do {
    if (const std::string notice = take_job_end_notice(); !notice.empty()) end_after_notice(notice, 1);
    usleep(10000);
  } while (std::chrono::steady_clock::now() < deadline);
}

}  // namespace scalestudy
