#pragma once
// Time on a backend's compute stream. A mark is a point in stream order; its time is
// known once the stream has passed it, which finish_step() waits for. On the CPU the
// stream is the calling thread and a mark is the steady clock's reading; on CUDA it is
// an event recorded on the compute stream.
#include <chrono>
#include <cstddef>
#include <vector>

namespace scalestudy {

class StepTimer {
 public:
  virtual ~StepTimer() = default;
  // Sets the origin of the step's times at this point of the compute stream.
  virtual void start_step() = 0;
  // Records a point on the compute stream; returns its index within the step.
  virtual size_t mark() = 0;
  // Waits for the stream to pass every mark; returns each mark's seconds since the origin.
  virtual std::vector<double> finish_step() = 0;
  // The host clock's reading at start_step(): the epoch of host-side timestamps.
  virtual std::chrono::steady_clock::time_point host_origin() const = 0;
};

class HostStepTimer final : public StepTimer {
 public:
  void start_step() override {
    origin_ = std::chrono::steady_clock::now();
    marks_.clear();
  }
  size_t mark() override {
    marks_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count());
    return marks_.size() - 1;
  }
  std::vector<double> finish_step() override { return marks_; }
  std::chrono::steady_clock::time_point host_origin() const override { return origin_; }

 private:
  std::chrono::steady_clock::time_point origin_{};
  std::vector<double> marks_;
};

}  // namespace scalestudy
