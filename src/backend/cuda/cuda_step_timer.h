#pragma once
// Phase times on the CUDA compute stream, from events: a mark is an event recorded in
// stream order, and finish_step() waits for the last one and reads every mark's elapsed
// time from the origin's event.
#include <cuda_runtime.h>

#include <chrono>
#include <vector>

#include "timing/step_timer.h"

namespace scalestudy {

class CudaStepTimer final : public StepTimer {
 public:
  explicit CudaStepTimer(cudaStream_t stream);
  ~CudaStepTimer() override;
  CudaStepTimer(const CudaStepTimer&) = delete;
  CudaStepTimer& operator=(const CudaStepTimer&) = delete;

  void start_step() override;
  size_t mark() override;
  std::vector<double> finish_step() override;
  std::chrono::steady_clock::time_point host_origin() const override { return host_origin_; }

 private:
  cudaStream_t stream_;
  cudaEvent_t origin_ = nullptr;
  std::vector<cudaEvent_t> events_;  // reused from step to step
  size_t used_ = 0;
  std::chrono::steady_clock::time_point host_origin_{};
};

}  // namespace scalestudy
