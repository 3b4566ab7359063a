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

}  // namespace scalestudy
