// How a job that cannot go on ends, seen from one process. CollectiveWatchdog: a collective
// still in flight past the timeout is reported once, by a message naming the rank, the
// collective, its phase and its bytes; one that finishes in time, by forget() or by its done
// test, never is. Timeouts are reported here instead of ending the job (Hooks::on_timeout).
// The stop signals are recorded, not acted on, by their handler: the run stops at its next
// safe point, or a wait ends the job. tests/scripts/test_faults.sh covers the job's end in
// each case.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_watchdog.h"
#include "control/control_wait.h"
#include "control/stop_signal.h"

namespace scalestudy {
namespace {

using namespace std::chrono_literals;

constexpr double kTimeoutS = 0.2;
constexpr auto kPeriod = 10ms;

// The messages of the collectives that timed out, in order.
class TimeoutLog {
 public:
  CollectiveWatchdog::Hooks hooks() {
    CollectiveWatchdog::Hooks hooks;
    hooks.on_timeout = [this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex_);
      messages_.push_back(message);
      changed_.notify_all();
    };
    return hooks;
  }
  // Waits until `count` messages have come, or `limit` has passed.
  std::vector<std::string> wait_for(size_t count, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, limit, [&] { return messages_.size() >= count; });
    return messages_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> messages_;
};

TEST(CollectiveWatchdog, ReportsAStuckCollectiveByRankKindPhaseAndBytes) {
  TimeoutLog log;
  CollectiveWatchdog watchdog(3, kTimeoutS, log.hooks(), kPeriod);
  const auto started = std::chrono::steady_clock::now();
  watchdog.watch({7, CollectiveKind::reduce_scatter, "grad-comm", 3 << 20});
  const std::vector<std::string> messages = log.wait_for(1, 5s);
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  ASSERT_EQ(messages.size(), 1u) << "no timeout reported";
  // Rank 3 waits the peers' margin longer than rank 0, which writes the result file.
  EXPECT_GE(waited_s, kTimeoutS + kPeerTimeoutMarginS) << "reported before the timeout";
  EXPECT_EQ(messages[0],
            "collective reduce_scatter #7 (phase grad-comm, 3.0 MiB) did not finish within 1.2 s on rank 3 "
            "-- a peer may have died or be stuck");
  EXPECT_EQ(watchdog.in_flight(), 0u) << "a reported collective is no longer watched";
  EXPECT_EQ(log.wait_for(2, 100ms).size(), 1u) << "reported twice";
}

TEST(CollectiveWatchdog, ForgetsACollectiveThatFinishedInTime) {
  TimeoutLog log;
  CollectiveWatchdog watchdog(0, kTimeoutS, log.hooks(), kPeriod);
  watchdog.watch({1, CollectiveKind::allreduce, "grad-comm", 1024});
  watchdog.watch({2, CollectiveKind::barrier, "step", 0});
  EXPECT_EQ(watchdog.in_flight(), 2u);
  watchdog.forget(1);
  watchdog.forget(2);
  watchdog.forget(3);  // never watched: nothing happens
  EXPECT_EQ(watchdog.in_flight(), 0u);
  EXPECT_TRUE(log.wait_for(1, std::chrono::milliseconds(static_cast<int>(3 * kTimeoutS * 1000))).empty());
}

TEST(CollectiveWatchdog, DropsACollectiveWhoseTestSaysItIsDone) {
  TimeoutLog log;
  std::atomic<bool> done{false};
  CollectiveWatchdog watchdog(0, kTimeoutS, log.hooks(), kPeriod);
  watchdog.watch({1, CollectiveKind::allgather, "param-gather", 64}, [&done] { return done.load(); });
  std::this_thread::sleep_for(5 * kPeriod);
  EXPECT_EQ(watchdog.in_flight(), 1u) << "dropped before its test said done";
  done = true;
  const auto limit = std::chrono::steady_clock::now() + 2s;
  while (watchdog.in_flight() > 0 && std::chrono::steady_clock::now() < limit) std::this_thread::sleep_for(kPeriod);
  EXPECT_EQ(watchdog.in_flight(), 0u);
  EXPECT_TRUE(log.wait_for(1, std::chrono::milliseconds(static_cast<int>(2 * kTimeoutS * 1000))).empty());
}

// The oldest stuck collective is the one behind which the others wait: it is named first.
TEST(CollectiveWatchdog, NamesTheOldestStuckCollectiveFirst) {
  TimeoutLog log;
  CollectiveWatchdog watchdog(1, kTimeoutS, log.hooks(), kPeriod);
  watchdog.watch({4, CollectiveKind::allreduce, "grad-comm", 8});
  std::this_thread::sleep_for(2 * kPeriod);
  watchdog.watch({5, CollectiveKind::broadcast, "init", 8});
  const std::vector<std::string> messages = log.wait_for(2, 5s);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_NE(messages[0].find("allreduce #4 (phase grad-comm"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("broadcast #5 (phase init"), std::string::npos) << messages[1];
}

TEST(CollectiveWatchdog, RunsItsCheckEveryPeriod) {
  std::atomic<int> checks{0};
  CollectiveWatchdog::Hooks hooks;
  hooks.before_check = [&checks] { ++checks; };
  {
    CollectiveWatchdog watchdog(0, kTimeoutS, hooks, kPeriod);
    std::this_thread::sleep_for(20 * kPeriod);
  }
  // A loaded machine may stretch the periods, never add any.
  EXPECT_GE(checks.load(), 2);
  EXPECT_LE(checks.load(), 21);
}

// After the watchdog's tests: the signal this records stays with the process, and a
// watchdog or a control wait that sees one ends the job after its grace, so a test that
// follows it in one process must not leave a collective waiting.
TEST(StopSignal, TheFirstSignalIsRecordedAndNamed) {
  EXPECT_EQ(stop_signal(), 0);
  install_stop_signal_handlers();
  std::raise(SIGUSR1);
  EXPECT_EQ(stop_signal(), SIGUSR1) << "the handler records the signal and returns";
  // A different signal after the first does not replace it: the reason stays the first.
  std::raise(SIGINT);
  EXPECT_EQ(stop_signal(), SIGUSR1);
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(stop_reason(SIGTERM), "terminated by SIGTERM (time limit, scancel or kill)");
  EXPECT_EQ(stop_exit_code(SIGTERM), 143) << "128 + 15, as a shell reports it";
}

// A continue (the launcher waking a stopped rank to tear it down) is recorded, and is no
// stop signal: the first stop signal stays the reason.
TEST(StopSignal, AContinueIsRecordedAndIsNoStopSignal) {
  install_stop_signal_handlers();
  const int before = stop_signal();
  EXPECT_FALSE(was_continued());
  std::raise(SIGCONT);
  EXPECT_TRUE(was_continued()) << "the handler records the continue";
  EXPECT_EQ(stop_signal(), before);
}

TEST(ControlWait, ACompletedCollectiveReturnsItsResult) {
  set_control_timeout(5.0);
  const int mine = 3;
  int sum = 0;
  control_allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF, "test");
  EXPECT_EQ(sum, 3);
  EXPECT_EQ(control_timeout(), 5.0);
}

}  // namespace
}  // namespace scalestudy
