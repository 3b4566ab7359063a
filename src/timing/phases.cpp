#include "timing/phases.h"

namespace scalestudy {

const std::array<const char*, kPhaseCount>& phase_names() {
  static const std::array<const char*, kPhaseCount> names = {
      "data", "forward", "backward", "grad-comm", "optimizer", "param-gather", "step"};
  return names;
}

const char* phase_name(Phase phase) { return phase_names()[static_cast<int>(phase)]; }

void StepClock::start_step() {
  start_ = std::chrono::steady_clock::now();
  intervals_ = PhaseIntervals{};
}

double StepClock::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void StepClock::add_collectives(const std::vector<CollectiveRecord>& records) {
  for (const CollectiveRecord& collective : records) {
    if (collective.phase == phase_name(Phase::grad_comm)) record(Phase::grad_comm, collective.begin_s, collective.end_s);
    else if (collective.phase == phase_name(Phase::param_gather)) record(Phase::param_gather, collective.begin_s, collective.end_s);
  }
}

PhaseIntervals StepClock::finish_step() {
  intervals_[static_cast<int>(Phase::step)].extend(0.0, now());
  return intervals_;
}

}  // namespace scalestudy
