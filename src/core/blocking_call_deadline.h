#pragma once
// A deadline for blocking calls that MPI and NCCL give none: the start-up's node split
// (MPI_Comm_split_type) and NCCL's communicator init wait for every peer, so a peer that
// is stopped or gone would hold the others there forever. While a BlockingCallDeadline
// lives, a thread watches the clock; past the rank's control timeout (rank_timeout of
// core/control_wait.h) it ends the job with one line naming the phase.
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace scalestudy {

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
