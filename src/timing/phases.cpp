#include "timing/phases.h"

namespace scalestudy {

const std::array<const char*, kPhaseCount>& phase_names() {
  static const std::array<const char*, kPhaseCount> names = {
      "data", "forward", "backward", "grad-comm", "optimizer", "param-gather", "step"};
  return names;
}

const char* phase_name(Phase phase) { return phase_names()[static_cast<int>(phase)]; }

void StepClock::start_step() {
  timer_.start_step();
  pending_.clear();
  start_mark_ = timer_.mark();
}

PhaseIntervals StepClock::finish_step(const std::vector<CollectiveRecord>& collectives) {
  const size_t end_mark = timer_.mark();
  const std::vector<double> seconds = timer_.finish_step();
  PhaseIntervals intervals{};
  for (const Pending& p : pending_)
    intervals[static_cast<int>(p.phase)].extend(seconds[p.begin_mark], seconds[p.end_mark]);
  for (const CollectiveRecord& collective : collectives) {
    if (collective.phase == phase_name(Phase::grad_comm))
      intervals[static_cast<int>(Phase::grad_comm)].extend(collective.begin_s, collective.end_s);
    else if (collective.phase == phase_name(Phase::param_gather))
      intervals[static_cast<int>(Phase::param_gather)].extend(collective.begin_s, collective.end_s);
  }
  intervals[static_cast<int>(Phase::step)].extend(0.0, seconds[end_mark]);
  return intervals;
}

}  // namespace scalestudy
