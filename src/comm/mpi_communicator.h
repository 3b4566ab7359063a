#pragma once
// The MPI implementation of Communicator. Its comm stream is one worker thread that runs
// the queued collectives strictly in the order they were started, with blocking MPI calls
// on a communicator of its own, so the main thread computes while they run.
//
//   main thread:  start A ── start B ── compute ───────────── finish(A) ── finish(B)
//   comm stream:       [──── A ────][──── B ────]
//
// Timing. The worker stamps each collective with steady_clock time points when it takes it
// off the queue and when the MPI call returns. The stamps are turned into seconds since
// epoch() when take_records() hands them over, using the epoch in force at that call, so
// every record of one hand-over shares one time base with epoch_seconds_now() on the main
// thread. The trainer calls set_epoch() at the start of a step and take_records() at its
// end; a collective still running from the previous step then shows a negative begin_s.
// The epoch starts as the construction time.
//
// Threads. Every public member is called from one thread (the main thread); the worker
// shares only the queue, the records and the byte counters with it, under mutex_. The
// watchdog (comm/collective_watchdog.h) times every collective from its start to the end
// of its MPI calls.
// The communicator must be destroyed before MPI is finalized.
#include <mpi.h>

#include <array>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/collective_watchdog.h"
#include "comm/communicator.h"

namespace scalestudy {

struct MpiCall;  // what a queued collective needs of the communicator (the .cpp)

class MpiCommunicator final : public Communicator {
 public:
  using Clock = std::chrono::steady_clock;

  // Duplicates comm so that this communicator's traffic never matches anyone else's
  // messages. A collective that has not finished timeout_s after its start ends the job.
  MpiCommunicator(MPI_Comm comm, double timeout_s);
  ~MpiCommunicator() override;

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  CommHandle start_allreduce(const CollectiveArgs& args) override;
  CommHandle start_reduce_scatter(const CollectiveArgs& args) override;
  CommHandle start_allgather(const CollectiveArgs& args) override;
  CommHandle start_broadcast(const CollectiveArgs& args, int root) override;
  CommHandle start_barrier(const std::string& phase) override;

  void finish(CommHandle handle) override;
  void finish_all() override;

  std::vector<CollectiveRecord> take_records() override;
  std::vector<size_t> payload_bytes_by_kind() const override;
  // The bf16 forms' host copies of their buffers in bf16, at their largest.
  size_t staging_bytes() const override;
  // bf16_from_f32: an allreduce's buffer, a reduce-scatter's send and receive, in bf16.
  size_t staging_bytes_for(CollectiveKind kind, size_t elems, WireType wire) const override;

  Clock::time_point epoch() const { return epoch_; }
  // Affects the records handed over by later take_records() calls, including those of
  // collectives already queued or finished.
  void set_epoch(Clock::time_point epoch) override { epoch_ = epoch; }
  double epoch_seconds_now() const { return seconds_since_epoch(Clock::now()); }

  // MPI counts are int, so larger collectives are cut into calls of at most this many
  // elements each. Tests lower it to exercise the cutting on small buffers; it applies
  // to collectives started after the call.
  void set_max_elems_per_call(size_t elems);
  size_t max_elems_per_call() const { return max_elems_per_call_; }

 private:
  struct Pending {
    StartedCollective collective;
    std::function<void()> run;
  };
  struct FinishedStamp {
    StartedCollective collective;
    Clock::time_point begin;
    Clock::time_point end;
  };

  CommHandle start_bf16_allreduce(const CollectiveArgs& args);
  CommHandle start_bf16_reduce_scatter(const CollectiveArgs& args);
  MpiCall call_for(WireType wire, MPI_Op op) const;
  // Checks args, then queues run for the comm stream.
  CommHandle enqueue(CollectiveKind kind, const CollectiveArgs& args, std::function<void()> run);
  void worker_loop();
  // The bf16 forms' host copies hold this many bytes at once.
  void note_staging(size_t bytes);
  double seconds_since_epoch(Clock::time_point when) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;  // on MPI_UINT16_T holding bf16 bits
  int rank_ = 0;
  int world_size_ = 1;
  size_t max_elems_per_call_ = static_cast<size_t>(INT_MAX);
  Clock::time_point epoch_;  // main thread only
  uint64_t last_started_id_ = 0;  // main thread only
  // Main thread only: how long finish() blocked on each collective, by id.
  std::unordered_map<uint64_t, std::pair<Clock::time_point, Clock::time_point>> waits_;

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;  // the worker waits for work or for stopping_
  std::condition_variable work_done_;   // finish() waits for finished_through_
  std::deque<Pending> queue_;  // started and not yet taken by the worker, oldest first
  // Ids are issued in order and run in order, so the finished ones are exactly 1..this.
  uint64_t finished_through_ = 0;
  std::vector<FinishedStamp> finished_;
  std::array<size_t, kCollectiveKindCount> payload_bytes_by_kind_{};
  size_t staging_bytes_ = 0;
  bool stopping_ = false;

  CollectiveWatchdog watchdog_;  // times each collective from its start
  std::thread worker_;
};

}  // namespace scalestudy
