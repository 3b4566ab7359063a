#include "comm/collective_watchdog.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <optional>
#include <utility>

#include "core/check.h"
#include "control/control_wait.h"
#include "control/roll_call.h"
#include "control/stop_signal.h"

namespace scalestudy {
namespace {

std::string format_bytes(size_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

std::string format_seconds(double seconds) {
  char text[64];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

}  // namespace

CollectiveWatchdog::CollectiveWatchdog(int rank, double timeout_s, Hooks hooks, Clock::duration period)
    : rank_(rank), timeout_s_(timeout_s), hooks_(std::move(hooks)), period_(period) {
  SCALESTUDY_CHECK(timeout_s > 0.0, "the collective timeout must be a positive number of seconds, got " +
                                        std::to_string(timeout_s));
  thread_ = std::thread(&CollectiveWatchdog::run, this);
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::watch(const StartedCollective& collective, std::function<bool()> done) {
  Watched entry{collective, Clock::now(), std::move(done)};
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.push_back(std::move(entry));
}

void CollectiveWatchdog::forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto entry =
      std::find_if(watched_.begin(), watched_.end(), [id](const Watched& w) { return w.collective.id == id; });
  if (entry != watched_.end()) watched_.erase(entry);
}

size_t CollectiveWatchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return watched_.size();
}

void CollectiveWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_.wait_for(lock, period_, [this] { return stopping_; })) {
    if (hooks_.before_check) {
      lock.unlock();
      hooks_.before_check();
      lock.lock();
    }
    if (const std::string blocked = blocked_after_stop(Clock::now()); !blocked.empty()) {
      lock.unlock();  // as below: the abort hook must not wait on the owner's thread
      end_job_for_signal(stop_signal(), "waiting for " + blocked);
    }
    const std::optional<StartedCollective> stuck = take_timed_out(Clock::now());
    if (!stuck) continue;
    // Unlocked: ending the job runs the abort hook, which must not wait on the owner's
    // thread, and that thread may be in watch() or forget(); so does the roll call, which
    // waits for the peers' answers. A data-plane collective has no place in the control
    // plane's count, so a peer behind is one that has not reached this rank's last one.
    lock.unlock();
    const RollCall roll_call = take_roll_call(control_collectives_entered());
    // A lower rank that responds times out too, by its own deadline, and reports.
    if (!is_reporting_rank(roll_call))
      defer_to_reporting_rank(std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::duration<double>(timeout_s_)));
    const std::string message = timeout_message(*stuck, describe_roll_call(roll_call, ""));
    if (hooks_.on_timeout) {
      hooks_.on_timeout(message);
    } else {
      abort_job(__FILE__, __LINE__, "collective timed out", message);
    }
    lock.lock();
  }
}

std::string CollectiveWatchdog::blocked_after_stop(Clock::time_point now) {
  if (!stop_signal()) return "";
  if (signal_seen_ == Clock::time_point{}) signal_seen_ = now;
  if (now - signal_seen_ < kStopGrace) return "";
  watched_.erase(std::remove_if(watched_.begin(), watched_.end(), [](const Watched& w) { return w.done && w.done(); }),
                 watched_.end());
  if (watched_.empty()) return "";
  const StartedCollective& blocked = watched_.front().collective;
  return std::string("collective ") + collective_kind_name(blocked.kind) + " (phase " + blocked.phase + ")";
}

std::optional<StartedCollective> CollectiveWatchdog::take_timed_out(Clock::time_point now) {
  watched_.erase(std::remove_if(watched_.begin(), watched_.end(), [](const Watched& w) { return w.done && w.done(); }),
                 watched_.end());
  const auto stuck = std::find_if(watched_.begin(), watched_.end(), [&](const Watched& w) {
    return std::chrono::duration<double>(now - w.started).count() >= rank_timeout(timeout_s_, rank_);
  });
  if (stuck == watched_.end()) return std::nullopt;
  const StartedCollective collective = stuck->collective;
  watched_.erase(stuck);
  return collective;
}

std::string CollectiveWatchdog::timeout_message(const StartedCollective& stuck, const std::string& culprits) const {
  return std::string("collective ") + collective_kind_name(stuck.kind) + " #" + std::to_string(stuck.id) +
         " (phase " + stuck.phase + ", " + format_bytes(stuck.payload_bytes) + ") did not finish within " +
         format_seconds(rank_timeout(timeout_s_, rank_)) + " on rank " + std::to_string(rank_) + " -- " +
         (culprits.empty() ? "a peer may have died or be stuck" : culprits);
}

}  // namespace scalestudy
