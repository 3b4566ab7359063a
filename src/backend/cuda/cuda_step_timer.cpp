#include "backend/cuda/cuda_step_timer.h"

#include "cuda_check.h"

namespace scalestudy {

CudaStepTimer::CudaStepTimer(cudaStream_t stream) : stream_(stream) {
  CHECK_CUDA(cudaEventCreate(&origin_));
}

CudaStepTimer::~CudaStepTimer() {
  cudaEventDestroy(origin_);
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
}

void CudaStepTimer::start_step() {
  host_origin_ = std::chrono::steady_clock::now();
  CHECK_CUDA(cudaEventRecord(origin_, stream_));
  used_ = 0;
}

size_t CudaStepTimer::mark() {
  if (used_ == events_.size()) {
    cudaEvent_t event;
    CHECK_CUDA(cudaEventCreate(&event));
    events_.push_back(event);
  }
  CHECK_CUDA(cudaEventRecord(events_[used_], stream_));
  return used_++;
}

std::vector<double> CudaStepTimer::finish_step() {
  std::vector<double> seconds(used_);
  if (used_ == 0) return seconds;
  CHECK_CUDA(cudaEventSynchronize(events_[used_ - 1]));
  for (size_t i = 0; i < used_; ++i) {
    float ms = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, origin_, events_[i]));
    seconds[i] = static_cast<double>(ms) * 1e-3;
  }
  return seconds;
}

}  // namespace scalestudy
