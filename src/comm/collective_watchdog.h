#pragma once
// No rank waits forever in a collective. A thread of the watchdog's own checks every
// collective in flight once a period: one that has not finished within the timeout of its
// start ends the job with a message naming the rank, the collective, its phase, its bytes
// and, from a roll call (control/roll_call.h), the ranks that do not respond or lag behind;
// so does one still in flight after a stop signal and its grace. The check runs whatever
// the rank's other threads are doing, so a rank is ended even where nothing waits for the
// stuck collective.
//
// A collective is in flight from watch() until forget(), or until the `done` test given to
// watch() answers true. The test runs on the watchdog's thread, never after forget() has
// returned, so it may read what its owner frees once the collective is forgotten (a CUDA
// event it recycles, say).
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "comm/collective_args.h"

namespace scalestudy {

class CollectiveWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  struct Hooks {
    // Runs on the watchdog's thread before each check; it may end the job on an error it
    // finds (the NCCL communicator's asynchronous errors).
    std::function<void()> before_check;
    // Ends the job for a collective that timed out, given the message; abort_job when
    // unset. Should it return (tests), that collective is no longer watched.
    std::function<void(const std::string& message)> on_timeout;
  };

  // rank: the rank the messages name. timeout_s must be positive.
  CollectiveWatchdog(int rank, double timeout_s, Hooks hooks = {},
                     Clock::duration period = std::chrono::milliseconds(100));
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // The collective is in flight from now on, timed from now.
  void watch(const StartedCollective& collective, std::function<bool()> done = {});
  // The collective `id` has finished.
  void forget(uint64_t id);
  size_t in_flight() const;
  double timeout_s() const { return timeout_s_; }

 private:
  struct Watched {
    StartedCollective collective;
    Clock::time_point started;
    std::function<bool()> done;
  };

  void run();
  // Drops the collectives whose test says they are done, and takes out the oldest one
  // past the timeout, if any (mutex_ held).
  std::optional<StartedCollective> take_timed_out(Clock::time_point now);
  // culprits: the roll call's ranks that do not respond or did not arrive, or "".
  std::string timeout_message(const StartedCollective& stuck, const std::string& culprits) const;
  // After a stop signal (control/stop_signal.h) and its grace, the oldest collective still in
  // flight, named: this rank is blocked on a peer and would never reach the step's end.
  // "" while none is (mutex_ held).
  std::string blocked_after_stop(Clock::time_point now);

  const int rank_;
  const double timeout_s_;
  const Hooks hooks_;
  const Clock::duration period_;

  mutable std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::deque<Watched> watched_;  // oldest first
  Clock::time_point signal_seen_{};  // when the watchdog first saw a stop signal
  std::thread thread_;
};

}  // namespace scalestudy
