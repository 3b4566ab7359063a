#pragma once
// The control plane's collectives (the loss, the per-step record gathers, the start-up
// checks, the stop agreement) are started with MPI's nonblocking calls and waited for
// here, so that no rank waits past the timeout for a peer that is stuck or gone, and a
// stop signal ends a wait at once (control/stop_signal.h). Each is counted as it starts, so
// that a wait that times out can name the ranks that never came (control/roll_call.h). The
// blocking calls that have no nonblocking form run under a BlockingCallDeadline, which
// holds them to the same timeout.
#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace scalestudy {

// The longest a control-plane collective may take (--comm-timeout); 300 s until set.
void set_control_timeout(double seconds);
double control_timeout();

// Rank 0 writes the result file, so it gives up on a stuck collective first, and the other
// ranks this much later: a rank that gives up ends the job, and the launcher tears down
// every rank within about a second (Open MPI), which rank 0 needs to mark the file failed.
inline constexpr double kPeerTimeoutMarginS = 1.0;
// The bounds of --comm-timeout. It also holds the start-up's waits, which begin when a
// rank is ready and end when the last rank is: ranks that one launcher starts on one node
// arrive up to a few hundred ms apart (at 0.2 s, 1 of 12 healthy 2- and 4-rank CPU starts on
// two busy cores timed out, blaming a peer; at 0.5 s none), and a roll call listens 300 ms
// (kRollCallWindow). Below 1 s the timeout measures the launcher, not a stuck peer. Above
// 1e6 s (11.6 days, beyond the time limit of any batch job) a wait is a hang all the same,
// and the deadline, a steady_clock time point in 64-bit nanoseconds, stays far from its
// 292-year range: 1e300 s wrapped round and ended every start at once.
inline constexpr double kMinCommTimeoutS = 1.0;
inline constexpr double kMaxCommTimeoutS = 1e6;
// The timeout that `rank` waits for, given the run's: rank 0's, or the margin longer.
inline double rank_timeout(double timeout_s, int rank) {
  return rank == 0 ? timeout_s : timeout_s + kPeerTimeoutMarginS;
}

// The step (1-based) that the control plane's messages name; 0: none (start-up, finish).
void set_control_step(int step);

// Waits for `request`, the control collective number `number` (control/roll_call.h; 0 when
// it spans a subset of the ranks). A stop signal ends the job through end_job_for_signal.
// A wait past control_timeout() takes a roll call and ends the job with one line naming
// the collective, the phase, the step and the ranks that did not arrive or do not respond.
void wait_control(MPI_Request& request, int64_t number, const char* collective, const std::string& phase);

// The blocking forms that the control plane uses, each as its nonblocking call and
// wait_control.
void control_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                       MPI_Comm comm, const std::string& phase);
void control_gather(const void* send, int count, MPI_Datatype type, void* recv, int root,
                    MPI_Comm comm, const std::string& phase);
// A gather of `count` elements of `type` from each rank, counts[r] of them from rank r
// placed at offsets[r] of recv on the root (counts, offsets and recv matter there only).
struct GathervArgs {
  const void* send = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
  void* recv = nullptr;
  const int* counts = nullptr;
  const int* offsets = nullptr;
  int root = 0;
};
void control_gatherv(const GathervArgs& gather, MPI_Comm comm, const std::string& phase);
void control_allgather(const void* send, int count, MPI_Datatype type, void* recv, MPI_Comm comm,
                       const std::string& phase);
void control_barrier(MPI_Comm comm, const std::string& phase);

// A deadline for blocking calls that MPI and NCCL give none: the start-up's node split
// (MPI_Comm_split_type) and NCCL's communicator init wait for every peer, so a peer that
// is stopped or gone would hold the others there forever. While a BlockingCallDeadline
// lives, a thread watches the clock; past the rank's control timeout (rank_timeout) it
// ends the job with one line naming the phase.
class BlockingCallDeadline {
 public:
  BlockingCallDeadline(std::string phase, int rank);
  // Disarms the deadline: the calls completed in time.
  ~BlockingCallDeadline();
  BlockingCallDeadline(const BlockingCallDeadline&) = delete;
  BlockingCallDeadline& operator=(const BlockingCallDeadline&) = delete;

 private:
  void watch(double limit_s);
  std::string phase_;
  std::mutex mutex_;
  std::condition_variable finished_changed_;
  bool finished_ = false;
  std::thread watcher_;
};

}  // namespace scalestudy
