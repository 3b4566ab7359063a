// The GPU state of a step from its samples (profile/gpu_state.h), and over a run's
// measured steps (results/run_summary.h). The samples here are made up; the NVML sampler
// that takes real ones is tested on a GPU (tests/gpu/test_nvml_telemetry.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "profile/gpu_state.h"
#include "results/run_summary.h"

namespace scalestudy {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

GpuSample sample(double clock, double power, double temperature, int64_t reasons) {
  GpuSample s;
  s.sm_clock_mhz = clock;
  s.power_w = power;
  s.temperature_c = temperature;
  s.has_clock_event_reasons = true;
  s.clock_event_reasons = reasons;
  return s;
}

TEST(GpuState, NoSamplesGiveNaNAndNoBits) {
  GpuStateAccumulator accumulator;
  const StepGpuState state = accumulator.take();
  EXPECT_EQ(state.samples, 0);
  EXPECT_TRUE(std::isnan(state.sm_clock_mhz) && std::isnan(state.sm_clock_min_mhz) && std::isnan(state.power_w) &&
              std::isnan(state.temperature_c) && std::isnan(state.power_capped));
  EXPECT_EQ(state.clock_event_reasons, 0);
}

TEST(GpuState, MeansExtremesCapShareAndBitsOfAStep) {
  GpuStateAccumulator accumulator;
  accumulator.add(sample(1980, 500, 50, 0x0));
  accumulator.add(sample(1500, 700, 61, kClockEventSoftwarePowerCap));
  accumulator.add(sample(1620, 690, 58, kClockEventSoftwarePowerCap | 0x1));
  // A sample whose every read failed counts as a sample and changes no quantity.
  accumulator.add(GpuSample{});
  const StepGpuState state = accumulator.take();
  EXPECT_EQ(state.samples, 4);
  // Exact in double: sums of small integers divided once.
  EXPECT_EQ(state.sm_clock_mhz, (1980.0 + 1500.0 + 1620.0) / 3.0);
  EXPECT_EQ(state.sm_clock_min_mhz, 1500.0);
  EXPECT_EQ(state.power_w, (500.0 + 700.0 + 690.0) / 3.0);
  EXPECT_EQ(state.temperature_c, 61.0);
  EXPECT_EQ(state.power_capped, 2.0 / 3.0) << "the share of the samples that read their reasons";
  EXPECT_EQ(state.clock_event_reasons, kClockEventSoftwarePowerCap | 0x1);
}

TEST(GpuState, TakeStartsTheNextStepAfresh) {
  GpuStateAccumulator accumulator;
  accumulator.add(sample(1000, 300, 70, 0x40));
  (void)accumulator.take();
  accumulator.add(sample(1900, 650, 40, 0x0));
  const StepGpuState state = accumulator.take();
  EXPECT_EQ(state.samples, 1);
  EXPECT_EQ(state.sm_clock_min_mhz, 1900.0);
  EXPECT_EQ(state.temperature_c, 40.0);
  EXPECT_EQ(state.power_capped, 0.0);
  EXPECT_EQ(state.clock_event_reasons, 0);
}

TEST(GpuState, AQuantityNeverReadStaysNaN) {
  GpuStateAccumulator accumulator;
  GpuSample only_clock;
  only_clock.sm_clock_mhz = 1755;
  accumulator.add(only_clock);
  const StepGpuState state = accumulator.take();
  EXPECT_EQ(state.sm_clock_mhz, 1755.0);
  EXPECT_TRUE(std::isnan(state.power_w) && std::isnan(state.temperature_c) && std::isnan(state.power_capped));
}

GatheredStep step_of(bool warmup, bool traced, std::vector<StepGpuState> ranks) {
  GatheredStep step;
  step.warmup = warmup;
  step.traced = traced;
  step.gpu_state = std::move(ranks);
  return step;
}

StepGpuState rank_state(int64_t samples, double clock, double low, double power, double temperature, double capped,
                        int64_t reasons) {
  return {samples, clock, low, power, temperature, capped, reasons};
}

TEST(GpuStateSummary, MeasuredStepsOnlyEveryRankAndCapShareBySamples) {
  const std::vector<GatheredStep> steps = {
      // Warm-up and traced steps would move every figure below; they must not count.
      step_of(true, false, {rank_state(10, 500, 400, 100, 95, 0.0, 0x80), rank_state(10, 500, 400, 100, 95, 0.0, 0)}),
      step_of(false, true, {rank_state(10, 600, 300, 900, 99, 0.0, 0x40), rank_state(10, 600, 300, 900, 99, 0.0, 0)}),
      step_of(false, false, {rank_state(10, 1800, 1600, 690, 60, 1.0, 0x4), rank_state(5, 1900, 1700, 650, 62, 0.0, 0)}),
      step_of(false, false, {rank_state(10, 1700, 1500, 700, 61, 0.5, 0x4), rank_state(0, kNaN, kNaN, kNaN, kNaN, kNaN, 0)}),
  };
  const GpuStateSummary s = summarize_gpu_state(steps);
  EXPECT_EQ(s.samples, 25);
  EXPECT_EQ(s.sm_clock_median_mhz, 1800.0) << "median of 1800, 1900 and 1700";
  EXPECT_EQ(s.sm_clock_min_mhz, 1500.0);
  EXPECT_EQ(s.power_median_w, 690.0);
  EXPECT_EQ(s.temperature_max_c, 62.0);
  EXPECT_EQ(s.power_capped, 15.0 / 25.0) << "(10 x 1 + 5 x 0 + 10 x 0.5) / 25, each step weighted by its samples";
  EXPECT_EQ(s.clock_event_reasons, 0x4);
}

TEST(GpuStateSummary, RunsWithoutSamplesSummariseToNone) {
  const std::vector<GatheredStep> steps = {step_of(false, false, {StepGpuState{}, StepGpuState{}})};
  const GpuStateSummary s = summarize_gpu_state(steps);
  EXPECT_EQ(s.samples, 0);
  EXPECT_TRUE(std::isnan(s.sm_clock_median_mhz) && std::isnan(s.power_capped));
}

}  // namespace
}  // namespace scalestudy
