#include "control/control_wait.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <utility>

#include "control/mpi_check.h"
#include "control/roll_call.h"
#include "control/stop_signal.h"

namespace scalestudy {
namespace {

std::atomic<double> timeout_s{300.0};
std::atomic<int> current_step{0};

// Spinning this long keeps a collective that completes at once (shared memory, a few
// ranks) as fast as a blocking call; after it, the wait sleeps between tests, up to a
// millisecond, so a long wait costs no core.
constexpr std::chrono::microseconds kSpin{200};
constexpr useconds_t kLongestSleepUs = 1000;

std::string seconds_text(double seconds) {
  char text[64];
  std::snprintf(text, sizeof(text), "%g", seconds);
  return text;
}

// "the control plane's allreduce (loss, step 12) did not complete within 3 s
// (--comm-timeout): rank 3 does not respond (stopped or gone)".
[[noreturn]] void end_job_for_timeout(int64_t number, const char* collective, const std::string& phase,
                                      double waited_s) {
  const int step = current_step.load();
  const std::string where = phase + (step > 0 ? ", step " + std::to_string(step) : "");
  const RollCall roll_call = number > 0 ? take_roll_call(number) : RollCall{};
  const std::string who = describe_roll_call(roll_call, "every rank arrived and responds");
  // A lower rank that responds times out too, by its own deadline, and reports.
  if (!is_reporting_rank(roll_call))
    defer_to_reporting_rank(std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(control_timeout())));
  end_job(std::string("the control plane's ") + collective + " (" + where + ") did not complete within " +
              seconds_text(waited_s) + " s (--comm-timeout): " + (who.empty() ? "a peer rank is stuck or gone" : who),
          1);
}

}  // namespace

void set_control_step(int step) { current_step.store(step); }

void set_control_timeout(double seconds) { timeout_s.store(seconds); }
double control_timeout() { return timeout_s.load(); }

void wait_control(MPI_Request& request, int64_t number, const char* collective, const std::string& phase) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  int rank = 0;
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const double limit_s = rank_timeout(control_timeout(), rank);
  const auto deadline = started + std::chrono::duration<double>(limit_s);
  auto stop_deadline = Clock::time_point::max();
  useconds_t sleep_us = 10;
  for (;;) {
    int done = 0;
    CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const auto now = Clock::now();
    if (const int signal = stop_signal()) {
      if (stop_deadline == Clock::time_point::max()) stop_deadline = now + kStopGrace;
      if (now > stop_deadline)
        end_job_for_signal(signal, std::string("waiting for the control plane's ") + collective + " (" + phase + ")");
    }
    if (now > deadline) end_job_for_timeout(number, collective, phase, limit_s);
    if (now - started > kSpin) {
      usleep(sleep_us);
      sleep_us = sleep_us * 2 > kLongestSleepUs ? kLongestSleepUs : sleep_us * 2;
    }
  }
}

void control_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                       MPI_Comm comm, const std::string& phase) {
  const int64_t number = enter_control_collective(comm);
  MPI_Request request;
  CHECK_MPI(MPI_Iallreduce(send, recv, count, type, op, comm, &request));
  wait_control(request, number, "allreduce", phase);
}

void control_gather(const void* send, int count, MPI_Datatype type, void* recv, int root,
                    MPI_Comm comm, const std::string& phase) {
  const int64_t number = enter_control_collective(comm);
  MPI_Request request;
  CHECK_MPI(MPI_Igather(send, count, type, recv, count, type, root, comm, &request));
  wait_control(request, number, "gather", phase);
}

void control_gatherv(const GathervArgs& g, MPI_Comm comm, const std::string& phase) {
  const int64_t number = enter_control_collective(comm);
  MPI_Request request;
  CHECK_MPI(MPI_Igatherv(g.send, g.count, g.type, g.recv, g.counts, g.offsets, g.type, g.root, comm, &request));
  wait_control(request, number, "gatherv", phase);
}

void control_allgather(const void* send, int count, MPI_Datatype type, void* recv, MPI_Comm comm,
                       const std::string& phase) {
  const int64_t number = enter_control_collective(comm);
  MPI_Request request;
  CHECK_MPI(MPI_Iallgather(send, count, type, recv, count, type, comm, &request));
  wait_control(request, number, "allgather", phase);
}

void control_barrier(MPI_Comm comm, const std::string& phase) {
  const int64_t number = enter_control_collective(comm);
  MPI_Request request;
  CHECK_MPI(MPI_Ibarrier(comm, &request));
  wait_control(request, number, "barrier", phase);
}

BlockingCallDeadline::BlockingCallDeadline(std::string phase, int rank) : phase_(std::move(phase)) {
  const double limit_s = rank_timeout(control_timeout(), rank);
  watcher_ = std::thread([this, limit_s] { watch(limit_s); });
}

BlockingCallDeadline::~BlockingCallDeadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
  }
  finished_changed_.notify_all();
  watcher_.join();
}

void BlockingCallDeadline::watch(double limit_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_changed_.wait_for(lock, std::chrono::duration<double>(limit_s), [this] { return finished_; })) return;
  end_job(phase_ + " did not complete within " + seconds_text(limit_s) +
              " s (--comm-timeout): a peer rank is stuck or gone",
          1);
}

}  // namespace scalestudy
