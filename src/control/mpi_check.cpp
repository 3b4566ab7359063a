#include "control/mpi_check.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <vector>

namespace scalestudy {

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

int world_rank() {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void abort_world(int exit_code) { MPI_Abort(MPI_COMM_WORLD, exit_code); }

constexpr JobEnder kMpiJobEnder{.running = mpi_running,
                                .rank = world_rank,
                                .send_notice = send_job_end_notice,
                                .take_notice = take_job_end_notice,
                                .abort = abort_world};

}  // namespace

void install_mpi_job_ender() { set_job_ender(&kMpiJobEnder); }

}  // namespace scalestudy
