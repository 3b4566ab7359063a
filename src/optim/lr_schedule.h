#pragma once
namespace scalestudy {

// Linear warm-up to the peak over warmup_steps, then a cosine decay to peak*min_ratio at
// the last step. Steps are 0-based.
struct LearningRateSchedule {
  float peak = 0.0f;
  float min_ratio = 0.1f;
  int warmup_steps = 0;
  int total_steps = 1;
  float at(int step) const;
};

}  // namespace scalestudy
