#pragma once
// The phases of a training step and the [begin, end] interval each took on its stream,
// in seconds from the start of the step. "grad-comm" and "param-gather" run on the comm
// stream; the others on the compute stream; "step" spans the whole step. The compute
// stream's phases are marks of the backend's StepTimer; the comm stream's come from the
// records that the communicators write of each collective (CollectiveRecord), which the
// result files keep too.
//
// With gradient accumulation a phase occurs once per micro-batch; its interval is then
// the hull from its first begin to its last end.
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "timing/step_timer.h"

namespace scalestudy {

enum class Phase { data, forward, backward, grad_comm, optimizer, param_gather, step };
inline constexpr int kPhaseCount = 7;
const char* phase_name(Phase phase);
const std::array<const char*, kPhaseCount>& phase_names();

struct Interval {
  double begin = std::numeric_limits<double>::quiet_NaN();
  double end = std::numeric_limits<double>::quiet_NaN();
  bool empty() const { return std::isnan(begin); }
  double length() const { return empty() ? 0.0 : end - begin; }
  void extend(double b, double e) {
    if (empty() || b < begin) begin = b;
    if (std::isnan(end) || e > end) end = e;
  }
};

using PhaseIntervals = std::array<Interval, kPhaseCount>;

// The collectives of the comm stream. Communicators write a CollectiveRecord of each; the
// step clock and the result files read them.
enum class CollectiveKind { allreduce, reduce_scatter, allgather, broadcast, barrier };
inline constexpr int kCollectiveKindCount = 5;
// The names match the enumerators so that result files and the analysis package can map
// them back without a second table.
inline constexpr EnumNames<CollectiveKind, kCollectiveKindCount> kCollectiveKindNames{
    {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"}, "unknown"};
static_assert(kCollectiveKindNames.complete());
inline const char* collective_kind_name(CollectiveKind kind) { return kCollectiveKindNames.name(kind); }

// What the comm stream did for one collective, for timing and byte accounting.
// Times are seconds on the steady clock since Communicator::epoch().
struct CollectiveRecord {
  CollectiveKind kind = CollectiveKind::barrier;
  std::string phase;        // the training phase that started it, e.g. "grad-comm"
  size_t payload_bytes = 0; // bytes of the full (unsharded) buffer the collective covers
  double begin_s = 0.0;
  double end_s = 0.0;
  // When the compute stream was blocked in finish() waiting for this collective; NaN
  // when it never waited (the collective was done, or hidden, by then). Blocked time
  // inside a compute phase is communication that compute did not hide.
  double wait_begin_s = std::numeric_limits<double>::quiet_NaN();
  double wait_end_s = std::numeric_limits<double>::quiet_NaN();
};

// Times the compute-stream phases of one step with the backend's StepTimer, and takes
// the comm-stream phases from the records of the collectives that ran during the step.
class StepClock {
 public:
  explicit StepClock(StepTimer& timer) : timer_(timer) {}
  void start_step();
  std::chrono::steady_clock::time_point host_origin() const { return timer_.host_origin(); }
  size_t mark() { return timer_.mark(); }
  void record(Phase phase, size_t begin_mark, size_t end_mark) {
    pending_.push_back({phase, begin_mark, end_mark});
  }
  // Resolves the marks (waiting for the compute stream), adds the comm-stream phases
  // from the collective records (same origin), and closes the "step" interval.
  PhaseIntervals finish_step(const std::vector<CollectiveRecord>& collectives);

 private:
  struct Pending {
    Phase phase;
    size_t begin_mark, end_mark;
  };
  StepTimer& timer_;
  size_t start_mark_ = 0;
  std::vector<Pending> pending_;
};

// Times a compute-stream phase for as long as it is in scope.
class ScopedPhase {
 public:
  ScopedPhase(StepClock& clock, Phase phase) : clock_(clock), phase_(phase), begin_(clock.mark()) {}
  ~ScopedPhase() { clock_.record(phase_, begin_, clock_.mark()); }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  StepClock& clock_;
  Phase phase_;
  size_t begin_;
};

}  // namespace scalestudy
