#include "profile/gpu_state.h"

#include <algorithm>
#include <cmath>

namespace scalestudy {

void GpuStateAccumulator::Sum::add(double value) {
  if (std::isnan(value)) return;
  ++count;
  total += value;
  low = std::min(low, value);
  high = std::max(high, value);
}

double GpuStateAccumulator::Sum::mean() const {
  return count > 0 ? total / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
}

void GpuStateAccumulator::add(const GpuSample& sample) {
  ++samples_;
  sm_clock_.add(sample.sm_clock_mhz);
  power_.add(sample.power_w);
  temperature_.add(sample.temperature_c);
  if (sample.has_clock_event_reasons) {
    ++reason_reads_;
    reasons_ |= sample.clock_event_reasons;
    if (sample.clock_event_reasons & kClockEventSoftwarePowerCap) ++power_capped_reads_;
  }
}

StepGpuState GpuStateAccumulator::take() {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  StepGpuState state;
  state.samples = samples_;
  state.sm_clock_mhz = sm_clock_.mean();
  state.sm_clock_min_mhz = sm_clock_.count > 0 ? sm_clock_.low : kNaN;
  state.power_w = power_.mean();
  state.temperature_c = temperature_.count > 0 ? temperature_.high : kNaN;
  state.power_capped = reason_reads_ > 0
                           ? static_cast<double>(power_capped_reads_) / static_cast<double>(reason_reads_)
                           : kNaN;
  state.clock_event_reasons = reasons_;
  *this = GpuStateAccumulator{};
  return state;
}

StepGpuState summarize_gpu_samples(const std::vector<GpuSample>& samples) {
  GpuStateAccumulator accumulator;
  for (const GpuSample& sample : samples) accumulator.add(sample);
  return accumulator.take();
}

PhaseGpuStates summarize_gpu_samples_by_phase(const std::vector<GpuSample>& samples,
                                              std::chrono::steady_clock::time_point origin,
                                              const PhaseIntervals& intervals) {
  std::array<GpuStateAccumulator, kPhaseCount> phases;
  for (const GpuSample& sample : samples) {
    const double at_s = std::chrono::duration<double>(sample.taken_at - origin).count();
    for (int p = 0; p < kPhaseCount; ++p) {
      const Interval& interval = intervals[static_cast<size_t>(p)];
      if (!interval.empty() && interval.begin <= at_s && at_s <= interval.end) phases[static_cast<size_t>(p)].add(sample);
    }
  }
  PhaseGpuStates states;
  for (int p = 0; p < kPhaseCount; ++p) {
    const StepGpuState state = phases[static_cast<size_t>(p)].take();
    states[static_cast<size_t>(p)] = {state.samples, state.sm_clock_mhz, state.power_w};
  }
  return states;
}

}  // namespace scalestudy
