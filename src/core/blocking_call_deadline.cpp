#include "core/blocking_call_deadline.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "core/check.h"
#include "core/control_wait.h"

namespace scalestudy {

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
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", limit_s);
  end_job(phase_ + " did not complete within " + seconds + " s (--comm-timeout): a peer rank is stuck or gone", 1);
}

}  // namespace scalestudy
