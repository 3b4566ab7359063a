#pragma once
// Dynamic loss scaling for fp16, whose narrow range would flush small gradients to zero:
// the loss (and so every gradient) is multiplied by a scale; a step whose gradients
// overflow is skipped and the scale halved; after growth_interval good steps in a row it
// is doubled. The defaults are those of PyTorch's GradScaler (initial 2^16, factors 2
// and 0.5, growth interval 2000). Powers of two keep scaling and unscaling exact.
namespace scalestudy {

class DynamicLossScaler {
 public:
  DynamicLossScaler(bool enabled, float initial_scale, int growth_interval)
      : enabled_(enabled), scale_(enabled ? initial_scale : 1.0f), growth_interval_(growth_interval) {}

  bool enabled() const { return enabled_; }
  float scale() const { return scale_; }

  // Called once per step with whether the gradients were finite; returns whether the
  // step's update should be applied.
  bool update(bool gradients_finite) {
    if (!enabled_) return true;
    if (!gradients_finite) {
      scale_ *= 0.5f;
      good_steps_ = 0;
      return false;
    }
    if (++good_steps_ >= growth_interval_) {
      scale_ *= 2.0f;
      good_steps_ = 0;
    }
    return true;
  }

 private:
  bool enabled_;
  float scale_;
  int growth_interval_;
  int good_steps_ = 0;
};

}  // namespace scalestudy
