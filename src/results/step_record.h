#pragma once
// What one rank measured in one training step, and the observer that receives it: the
// trainer produces these records, the result files and the progress lines consume them.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/memory_estimate.h"
#include "profile/gpu_state.h"
#include "timing/phases.h"

namespace scalestudy {

struct StepRecord {
  int step = 0;
  bool warmup = false;
  double loss = 0.0;           // mean over the global batch
  int64_t tokens = 0;          // tokens processed by all ranks
  float learning_rate = 0.0f;
  double grad_norm = 0.0;
  float loss_scale = 1.0f;     // the scale this step's gradients were computed with
  bool skipped = false;        // overflow: the update was not applied
  bool traced = false;         // inside the kernel profile's window
  PhaseIntervals intervals{};  // this rank's
  double comm_wait_s = 0.0;    // time this rank's compute stream was blocked on collectives
  std::vector<CollectiveRecord> collectives;
  std::array<size_t, kCollectiveKindCount> comm_bytes{};
  StepGpuState gpu_state;      // this rank's GPU over the step; no samples without telemetry
  PhaseGpuStates gpu_phases{};  // the same samples by the phase that ran when each was taken
};

struct MemoryReport {
  std::array<size_t, kMemoryKindCount> bytes{};  // by MemoryKind
  size_t peak_bytes = 0;
  std::string peak_source;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void on_step(const StepRecord& record) = 0;
};

}  // namespace scalestudy
