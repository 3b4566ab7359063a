#pragma once
// Milliseconds a call of a piece of GPU work, for the timing programs of dev/: 5 trials of
// `reps` calls after one warm-up trial, timed with events on the work's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "cuda_check.h"

namespace scalestudy::gpu_test {

struct TrialTimes {
  double median_ms = 0.0;
  double fastest_ms = 0.0;
  double slowest_ms = 0.0;
};

inline TrialTimes time_trials(cudaStream_t stream, int reps, const std::function<void()>& work) {
  constexpr int kTrials = 5;
  cudaEvent_t begin = nullptr, end = nullptr;
  CHECK_CUDA(cudaEventCreate(&begin));
  CHECK_CUDA(cudaEventCreate(&end));
  std::vector<double> trials;
  for (int trial = 0; trial <= kTrials; ++trial) {
    CHECK_CUDA(cudaEventRecord(begin, stream));
    for (int r = 0; r < reps; ++r) work();
    CHECK_CUDA(cudaEventRecord(end, stream));
    CHECK_CUDA(cudaEventSynchronize(end));
    float ms = 0.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, begin, end));
    if (trial > 0) trials.push_back(ms / reps);  // the first warms up
  }
  CHECK_CUDA(cudaEventDestroy(begin));
  CHECK_CUDA(cudaEventDestroy(end));
  std::sort(trials.begin(), trials.end());
  return {trials[trials.size() / 2], trials.front(), trials.back()};
}

}  // namespace scalestudy::gpu_test
