#include "control/roll_call.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "control/mpi_check.h"

namespace scalestudy {
namespace {

std::atomic<int64_t> entered{0};

// How often the responder looks for a query: well inside kRollCallWindow, and rare enough
// that the thread costs nothing measurable.
constexpr std::chrono::milliseconds kResponderPeriod{10};

// A query carries the roll call's number, and its answer the same number and the count,
// so that a late answer to an earlier roll call is never taken for one to this.
struct Answer {
  int64_t roll_call = 0;
  int64_t entered = 0;
};

class Responder {
 public:
  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_.joinable()) return;
    stopping_ = false;
    thread_ = std::thread(&Responder::run, this);
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) return;
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  bool running() {
    std::lock_guard<std::mutex> lock(mutex_);
    return thread_.joinable();
  }

 private:
  struct Outgoing {
    Answer answer;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  void run() {
    int64_t query = 0;
    MPI_Request receive = MPI_REQUEST_NULL;
    CHECK_MPI(MPI_Irecv(&query, 1, MPI_INT64_T, MPI_ANY_SOURCE, kRollCallQueryTag, MPI_COMM_WORLD, &receive));
    std::vector<std::unique_ptr<Outgoing>> outgoing;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, kResponderPeriod, [this] { return stopping_; })) {
      lock.unlock();
      int arrived = 0;
      MPI_Status status;
      CHECK_MPI(MPI_Test(&receive, &arrived, &status));
      if (arrived) {
        auto reply = std::make_unique<Outgoing>();
        reply->answer = {query, entered.load(std::memory_order_relaxed)};
        CHECK_MPI(MPI_Isend(&reply->answer, 2, MPI_INT64_T, status.MPI_SOURCE, kRollCallAnswerTag, MPI_COMM_WORLD,
                            &reply->request));
        outgoing.push_back(std::move(reply));
        CHECK_MPI(MPI_Irecv(&query, 1, MPI_INT64_T, MPI_ANY_SOURCE, kRollCallQueryTag, MPI_COMM_WORLD, &receive));
      }
      forget_sent(outgoing);
      lock.lock();
    }
    lock.unlock();
    CHECK_MPI(MPI_Cancel(&receive));
    CHECK_MPI(MPI_Wait(&receive, MPI_STATUS_IGNORE));
    forget_sent(outgoing);
    // An answer to a querier that is gone never completes; MPI frees its request when it
    // does, and its buffer stays allocated until then.
    for (std::unique_ptr<Outgoing>& pending : outgoing) {
      CHECK_MPI(MPI_Request_free(&pending->request));
      (void)pending.release();
    }
  }

  static void forget_sent(std::vector<std::unique_ptr<Outgoing>>& outgoing) {
    for (auto it = outgoing.begin(); it != outgoing.end();) {
      int sent = 0;
      CHECK_MPI(MPI_Test(&(*it)->request, &sent, MPI_STATUS_IGNORE));
      it = sent ? outgoing.erase(it) : it + 1;
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// Never destroyed: a process that exits without MPI_Finalize must not meet a joinable
// thread in a static destructor (std::terminate).
Responder& responder() {
  static Responder* const instance = new Responder;
  return *instance;
}

int world_size() {
  int size = 1;
  CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

std::vector<int> unanswered(const std::vector<char>& answered) {
  std::vector<int> ranks;
  for (size_t rank = 0; rank < answered.size(); ++rank)
    if (!answered[rank]) ranks.push_back(static_cast<int>(rank));
  return ranks;
}

}  // namespace

int64_t enter_control_collective(MPI_Comm comm) {
  int size = 0;
  CHECK_MPI(MPI_Comm_size(comm, &size));
  if (size != world_size()) return 0;
  return entered.fetch_add(1, std::memory_order_relaxed) + 1;
}

int64_t control_collectives_entered() { return entered.load(std::memory_order_relaxed); }

void start_roll_call_responder() { responder().start(); }
void stop_roll_call_responder() { responder().stop(); }

RollCall take_roll_call(int64_t collective, std::chrono::milliseconds window) {
  RollCall roll_call;
  const int size = world_size();
  if (size == 1 || !responder().running()) return roll_call;
  int rank = 0;
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  // One at a time (the watchdog's thread and the main thread may both time out). The
  // numbers live on: a query to a stopped rank stays in flight after its request is freed.
  static std::mutex one_at_a_time;
  static std::atomic<int64_t> last_roll_call{0};
  std::lock_guard<std::mutex> lock(one_at_a_time);
  auto* const number = new int64_t(last_roll_call.fetch_add(1) + 1);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    MPI_Request query;
    CHECK_MPI(MPI_Isend(number, 1, MPI_INT64_T, peer, kRollCallQueryTag, MPI_COMM_WORLD, &query));
    CHECK_MPI(MPI_Request_free(&query));
  }
  std::vector<char> answered(static_cast<size_t>(size), 0);
  answered[static_cast<size_t>(rank)] = 1;
  int missing = size - 1;
  const auto deadline = std::chrono::steady_clock::now() + window;
  while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
    int found = 0;
    MPI_Message message;
    MPI_Status status;
    CHECK_MPI(MPI_Improbe(MPI_ANY_SOURCE, kRollCallAnswerTag, MPI_COMM_WORLD, &found, &message, &status));
    if (!found) {
      usleep(1000);
      continue;
    }
    Answer answer;
    CHECK_MPI(MPI_Mrecv(&answer, 2, MPI_INT64_T, &message, MPI_STATUS_IGNORE));
    const auto peer = static_cast<size_t>(status.MPI_SOURCE);
    if (answer.roll_call != *number || answered[peer]) continue;
    answered[peer] = 1;
    --missing;
    if (answer.entered < collective) roll_call.behind.push_back(status.MPI_SOURCE);
  }
  std::sort(roll_call.behind.begin(), roll_call.behind.end());
  roll_call.silent = unanswered(answered);
  roll_call.caller = rank;
  roll_call.taken = true;
  return roll_call;
}

bool is_reporting_rank(const RollCall& roll_call) {
  if (!roll_call.taken) return true;
  for (int rank = 0; rank < roll_call.caller; ++rank)
    if (std::find(roll_call.silent.begin(), roll_call.silent.end(), rank) == roll_call.silent.end()) return false;
  return true;
}

std::string describe_roll_call(const RollCall& roll_call, const std::string& all_answered) {
  if (!roll_call.taken) return "";
  std::string text;
  if (!roll_call.silent.empty())
    text = rank_list(roll_call.silent) + (roll_call.silent.size() == 1 ? " does" : " do") +
           " not respond (stopped or gone)";
  if (!roll_call.behind.empty()) {
    if (!text.empty()) text += "; ";
    text += rank_list(roll_call.behind) + " did not arrive (" +
            (roll_call.behind.size() == 1 ? "it responds" : "they respond") + ": slow, or stuck elsewhere)";
  }
  return text.empty() ? all_answered : text;
}

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t first = 0; first < ranks.size();) {
    size_t last = first;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) ++last;
    if (first > 0) text += ", ";
    text += std::to_string(ranks[first]);
    if (last > first) text += "-" + std::to_string(ranks[last]);
    first = last + 1;
  }
  return text;
}

}  // namespace scalestudy
