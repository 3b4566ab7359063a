#pragma once
// The phases of a training step and the [begin, end] interval each took on its stream,
// in seconds from the start of the step. "grad-comm" and "param-gather" run on the comm
// stream; the others on the compute stream; "step" spans the whole step.
//
// With gradient accumulation a phase occurs once per micro-batch; its interval is then
// the hull from its first begin to its last end.
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "comm/communicator.h"

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

// Times the compute-stream phases of one step with the steady clock (the CPU backend's
// compute stream is the calling thread) and takes the comm-stream phases from the
// records of the collectives that ran during the step.
class StepClock {
 public:
  void start_step();
  double now() const;
  std::chrono::steady_clock::time_point step_start() const { return start_; }
  void record(Phase phase, double begin, double end) {
    intervals_[static_cast<int>(phase)].extend(begin, end);
  }
  // Adds the comm-stream phases from collective records, whose times are relative to
  // the same step start.
  void add_collectives(const std::vector<CollectiveRecord>& records);
  PhaseIntervals finish_step();

 private:
  std::chrono::steady_clock::time_point start_{};
  PhaseIntervals intervals_{};
};

// Times a compute-stream phase for as long as it is in scope.
class ScopedPhase {
 public:
  ScopedPhase(StepClock& clock, Phase phase) : clock_(clock), phase_(phase), begin_(clock.now()) {}
  ~ScopedPhase() { clock_.record(phase_, begin_, clock_.now()); }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  StepClock& clock_;
  Phase phase_;
  double begin_;
};

}  // namespace scalestudy
