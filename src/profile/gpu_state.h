#pragma once
// The GPU's state over a training step, from samples a backend takes while the step
// runs (NVML on cuda: src/backend/cuda/nvml_telemetry.h): its SM clock, power,
// temperature and the reasons its clocks were held. A scaling study needs them to tell
// an efficiency lost to communication from one lost to the power budget: two busy GPUs
// of one board may run at lower clocks than one.
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

#include "timing/phases.h"

namespace scalestudy {

// NVML's clock event reasons (nvmlClocksEventReasons): why the clocks are below the
// application clocks. Only the software power cap is counted on its own.
inline constexpr int64_t kClockEventSoftwarePowerCap = 0x4;

// One reading of the GPU. A quantity NVML refused to read is NaN (its reasons: absent).
struct GpuSample {
  std::chrono::steady_clock::time_point taken_at{};  // the host's steady clock, as StepTimer's origin
  double sm_clock_mhz = std::numeric_limits<double>::quiet_NaN();
  double power_w = std::numeric_limits<double>::quiet_NaN();
  double temperature_c = std::numeric_limits<double>::quiet_NaN();
  bool has_clock_event_reasons = false;
  int64_t clock_event_reasons = 0;
};

// A step's samples summarised (docs/results-schema.md, "The GPUs' state"). Every
// quantity's mean or extreme covers only the samples that read it; NaN where none did.
struct StepGpuState {
  int64_t samples = 0;
  double sm_clock_mhz = std::numeric_limits<double>::quiet_NaN();      // mean
  double sm_clock_min_mhz = std::numeric_limits<double>::quiet_NaN();  // lowest
  double power_w = std::numeric_limits<double>::quiet_NaN();           // mean
  double temperature_c = std::numeric_limits<double>::quiet_NaN();     // highest
  double power_capped = std::numeric_limits<double>::quiet_NaN();      // fraction of samples
  int64_t clock_event_reasons = 0;                                     // bitwise OR
};

// Sums samples until take() summarises and restarts. Not thread-safe: the sampler
// guards it.
class GpuStateAccumulator {
 public:
  void add(const GpuSample& sample);
  StepGpuState take();

 private:
  struct Sum {
    int64_t count = 0;
    double total = 0.0;
    double low = std::numeric_limits<double>::infinity();
    double high = -std::numeric_limits<double>::infinity();
    void add(double value);
    double mean() const;
  };
  int64_t samples_ = 0;
  Sum sm_clock_, power_, temperature_;
  int64_t reason_reads_ = 0, power_capped_reads_ = 0;
  int64_t reasons_ = 0;
};

// The step's summary of its samples.
StepGpuState summarize_gpu_samples(const std::vector<GpuSample>& samples);

// The GPU's state while one phase of a step ran (docs/results-schema.md, "The GPUs' state
// by phase").
struct PhaseGpuState {
  int64_t samples = 0;
  double sm_clock_mhz = std::numeric_limits<double>::quiet_NaN();  // mean
  double power_w = std::numeric_limits<double>::quiet_NaN();       // mean
};
using PhaseGpuStates = std::array<PhaseGpuState, kPhaseCount>;

// Each sample counts towards every phase whose interval (seconds from `origin`, the
// step's start on the host's clock) holds its time; phases that overlap share samples.
PhaseGpuStates summarize_gpu_samples_by_phase(const std::vector<GpuSample>& samples,
                                              std::chrono::steady_clock::time_point origin,
                                              const PhaseIntervals& intervals);

// A source of GPU samples. take_samples() hands over those taken since the previous call
// (or since the source started).
class GpuTelemetry {
 public:
  virtual ~GpuTelemetry() = default;
  virtual std::vector<GpuSample> take_samples() = 0;
};

}  // namespace scalestudy
