#pragma once
// The summary of a run, computed from the recorded intervals exactly as
// docs/results-schema.md (/summary) defines it; the analysis package recomputes it from
// the file and must agree.
#include <cstdint>
#include <array>
#include <string>
#include <vector>

#include "profile/gpu_state.h"
#include "timing/phases.h"

namespace scalestudy {

struct Span {
  double begin = 0.0;
  double end = 0.0;
};

// Length of the union of the spans (empty or reversed spans count as nothing).
double union_length(std::vector<Span> spans);
// Quantile with linear interpolation between order statistics (Hyndman–Fan type 7,
// numpy's default).
double quantile(std::vector<double> values, double q);

// What every rank recorded for one step, as rank 0 holds it after gathering.
struct GatheredStep {
  int64_t step_index = 0;
  bool warmup = false;
  double loss = 0.0;
  int64_t tokens = 0;
  double loss_scale = 1.0;
  bool skipped = false;
  bool traced = false;  // inside the --profile-kernels window
  std::vector<PhaseIntervals> intervals;                   // [rank]
  std::vector<std::vector<CollectiveRecord>> collectives;  // [rank]
  std::vector<StepGpuState> gpu_state;                     // [rank]
  std::vector<PhaseGpuStates> gpu_phases;                  // [rank]
};

struct StepComm {
  double comm_s = 0.0;     // union of the comm stream's collectives, clipped to the step
  double exposed_s = 0.0;  // the part of it that compute did not hide
};
// Exposed communication: comm time outside the compute phases (forward, backward,
// optimizer), where compute also does not count while it was blocked waiting for a
// collective: |A \ (C \ W)| = |A| - |A∩C| + |A∩C∩W|.
StepComm step_comm(const PhaseIntervals& intervals, const std::vector<CollectiveRecord>& collectives);

struct RunSummary {
  int64_t steps_measured = 0;
  double step_time_median_s = 0, step_time_q1_s = 0, step_time_q3_s = 0;
  double tokens_per_s = 0;
  double flops_per_step = 0;
  double recompute_flops_per_step = 0;  // what --recompute adds (an input, not in MFU)
  double tflops_per_gpu = 0;
  double peak_tflops_per_gpu = 0;
  std::string peak_source;
  double mfu = 0;
  double comm_time_median_s = 0, exposed_comm_median_s = 0;
  double exposed_comm_fraction = 0, comm_fraction_of_step = 0;
};

// Summarises the measured steps: neither warm-up nor traced.
RunSummary summarize(const std::vector<GatheredStep>& steps, int world_size, double flops_per_step,
                     double peak_tflops_per_gpu, const std::string& peak_source);

// The slowest rank's step length.
double step_time(const GatheredStep& step);

// What tracing cost: the mean step time of the traced steps against the median of the
// measured ones (NaN where there are none).
struct TracingCost {
  double traced_step_time_mean_s = 0, untraced_step_time_median_s = 0;
};
TracingCost tracing_cost(const std::vector<GatheredStep>& steps);

// The GPUs' state over the measured steps, every rank's: medians of the per-step means
// (NaN where no step had samples), the lowest clock, and the share of all samples whose
// clocks the software power cap held.
struct GpuStateSummary {
  int64_t samples = 0;
  double sm_clock_median_mhz = 0, sm_clock_min_mhz = 0, power_median_w = 0;
  double temperature_max_c = 0, power_capped = 0;
  int64_t clock_event_reasons = 0;
  // Per phase, the median of the steps' means over the steps and ranks that sampled it.
  std::array<double, kPhaseCount> phase_sm_clock_median_mhz{};
};
GpuStateSummary summarize_gpu_state(const std::vector<GatheredStep>& steps);

}  // namespace scalestudy
