#pragma once
#include <cmath>

namespace scalestudy {

// Linear warm-up to the peak over warmup_steps, then a cosine decay to peak*min_ratio at
// the last step. Steps are 0-based.
struct LearningRateSchedule {
  float peak = 0.0f;
  float min_ratio = 0.1f;
  int warmup_steps = 0;
  int total_steps = 1;
  float at(int step) const {
    if (step < warmup_steps) return peak * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
    const int decay_steps = total_steps - warmup_steps;
    if (decay_steps <= 1) return peak;
    const double progress = static_cast<double>(step - warmup_steps) / (decay_steps - 1);
    const double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
    const double floor = peak * static_cast<double>(min_ratio);
    return static_cast<float>(floor + (peak - floor) * cosine);
  }
};

}  // namespace scalestudy
