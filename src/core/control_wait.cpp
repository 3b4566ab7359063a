#include "core/control_wait.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "core/check.h"
#include "core/stop_signal.h"

namespace scalestudy {
namespace {

std::atomic<double> timeout_s{300.0};

// Spinning this long keeps a collective that completes at once (shared memory, a few
// ranks) as fast as a blocking call; after it, the wait sleeps between tests, up to a
// millisecond, so a long wait costs no core.
constexpr std::chrono::microseconds kSpin{200};
constexpr useconds_t kLongestSleepUs = 1000;


}  // namespace

void set_control_timeout(double seconds) { timeout_s.store(seconds); }
double control_timeout() { return timeout_s.load(); }

void wait_control(MPI_Request& request, const char* collective, const std::string& phase) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  int rank = 0;
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const auto deadline = started + std::chrono::duration<double>(rank_timeout(control_timeout(), rank));
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
    if (now > deadline) {
      char text[64];
      std::snprintf(text, sizeof(text), "%g", rank_timeout(control_timeout(), rank));
      end_job(std::string("the control plane's ") + collective + " (" + phase + ") did not complete within " +
                  text + " s (--comm-timeout): a peer rank is stuck or gone",
              1);
    }
    if (now - started > kSpin) {
      usleep(sleep_us);
      sleep_us = sleep_us * 2 > kLongestSleepUs ? kLongestSleepUs : sleep_us * 2;
    }
  }
}

void control_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                       MPI_Comm comm, const std::string& phase) {
  MPI_Request request;
  CHECK_MPI(MPI_Iallreduce(send, recv, count, type, op, comm, &request));
  wait_control(request, "allreduce", phase);
}

void control_gather(const void* send, int count, MPI_Datatype type, void* recv, int root,
                    MPI_Comm comm, const std::string& phase) {
  MPI_Request request;
  CHECK_MPI(MPI_Igather(send, count, type, recv, count, type, root, comm, &request));
  wait_control(request, "gather", phase);
}

void control_gatherv(const GathervArgs& g, MPI_Comm comm, const std::string& phase) {
  MPI_Request request;
  CHECK_MPI(MPI_Igatherv(g.send, g.count, g.type, g.recv, g.counts, g.offsets, g.type, g.root, comm, &request));
  wait_control(request, "gatherv", phase);
}

void control_allgather(const void* send, int count, MPI_Datatype type, void* recv, MPI_Comm comm,
                       const std::string& phase) {
  MPI_Request request;
  CHECK_MPI(MPI_Iallgather(send, count, type, recv, count, type, comm, &request));
  wait_control(request, "allgather", phase);
}

void control_barrier(MPI_Comm comm, const std::string& phase) {
  MPI_Request request;
  CHECK_MPI(MPI_Ibarrier(comm, &request));
  wait_control(request, "barrier", phase);
}

}  // namespace scalestudy
