// The GPU state of a step from its samples, whole and by phase (profile/gpu_state.h), and
// over a run's measured steps (results/run_summary.h). The samples here are made up; the NVML sampler
// that takes real ones is tested on a GPU (tests/gpu/test_gpu_profilers.cpp).
#include <gtest/gtest.h>

#include <chrono>
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

TEST(GpuState, AStepSummarisesAllItsSamples) {
  const StepGpuState state = summarize_gpu_samples({sample(1800, 600, 50, 0x4), sample(1600, 700, 55, 0x4)});
  EXPECT_EQ(state.samples, 2);
  EXPECT_EQ(state.sm_clock_mhz, 1700.0);
  EXPECT_EQ(state.power_w, 650.0);
  EXPECT_EQ(state.power_capped, 1.0);
}

// Samples at given milliseconds from a step's origin.
GpuSample sample_at(std::chrono::steady_clock::time_point origin, double at_ms, double clock, double power) {
  GpuSample s = sample(clock, power, 50, 0x4);
  s.taken_at = origin + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double, std::milli>(at_ms));
  return s;
}

TEST(GpuStateByPhase, EachSampleCountsInEveryPhaseThatRanWhenItWasTaken) {
  const auto origin = std::chrono::steady_clock::now();
  PhaseIntervals intervals{};
  auto set = [&](Phase phase, double begin_ms, double end_ms) {
    intervals[static_cast<size_t>(phase)] = {begin_ms / 1000.0, end_ms / 1000.0};
  };
  set(Phase::data, 0, 1);
  set(Phase::forward, 1, 30);
  set(Phase::backward, 30, 90);
  set(Phase::grad_comm, 50, 95);  // on the comm stream, beside backward and past it
  set(Phase::optimizer, 95, 97);
  set(Phase::step, 0, 100);
  // param-gather did not run: its interval stays empty.
  const std::vector<GpuSample> samples = {
      sample_at(origin, -4, 1111, 111),  // before the step: in no phase
      sample_at(origin, 10, 1800, 600),  // forward
      sample_at(origin, 20, 1700, 620),  // forward
      sample_at(origin, 40, 1650, 680),  // backward alone
      sample_at(origin, 60, 1600, 700),  // backward beside grad-comm
      sample_at(origin, 92, 1500, 690),  // grad-comm after backward: exposed
      sample_at(origin, 98, 1400, 300),  // between the optimizer and the step's end
      sample_at(origin, 103, 2222, 222),  // after the step: in no phase
  };
  const PhaseGpuStates phases = summarize_gpu_samples_by_phase(samples, origin, intervals);
  auto of = [&](Phase phase) { return phases[static_cast<size_t>(phase)]; };
  // Exact in double: means of at most a few integers.
  EXPECT_EQ(of(Phase::data).samples, 0);
  EXPECT_TRUE(std::isnan(of(Phase::data).sm_clock_mhz) && std::isnan(of(Phase::data).power_w));
  EXPECT_EQ(of(Phase::forward).samples, 2);
  EXPECT_EQ(of(Phase::forward).sm_clock_mhz, 1750.0);
  EXPECT_EQ(of(Phase::forward).power_w, 610.0);
  EXPECT_EQ(of(Phase::backward).samples, 2);
  EXPECT_EQ(of(Phase::backward).sm_clock_mhz, 1625.0);
  EXPECT_EQ(of(Phase::grad_comm).samples, 2) << "the sample beside backward and the exposed one";
  EXPECT_EQ(of(Phase::grad_comm).sm_clock_mhz, 1550.0);
  EXPECT_EQ(of(Phase::grad_comm).power_w, 695.0);
  EXPECT_EQ(of(Phase::optimizer).samples, 0);
  EXPECT_EQ(of(Phase::param_gather).samples, 0);
  EXPECT_EQ(of(Phase::step).samples, 6) << "every sample inside the step, none outside it";
  EXPECT_EQ(of(Phase::step).sm_clock_mhz, (1800.0 + 1700 + 1650 + 1600 + 1500 + 1400) / 6.0);
}

TEST(GpuStateByPhase, ABoundarySampleBelongsToBothPhasesAndNoIntervalsToNone) {
  const auto origin = std::chrono::steady_clock::now();
  PhaseIntervals intervals{};
  intervals[static_cast<size_t>(Phase::forward)] = {0.0, 0.010};
  intervals[static_cast<size_t>(Phase::backward)] = {0.010, 0.020};
  const std::vector<GpuSample> at_the_edge = {sample_at(origin, 10, 1500, 500)};
  const PhaseGpuStates phases = summarize_gpu_samples_by_phase(at_the_edge, origin, intervals);
  EXPECT_EQ(phases[static_cast<size_t>(Phase::forward)].samples, 1);
  EXPECT_EQ(phases[static_cast<size_t>(Phase::backward)].samples, 1);
  const PhaseGpuStates none = summarize_gpu_samples_by_phase(at_the_edge, origin, PhaseIntervals{});
  for (const PhaseGpuState& phase : none) EXPECT_EQ(phase.samples, 0);
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

TEST(GpuStateSummary, PhaseClocksAreMediansOverMeasuredStepsAndRanksThatSampledThem) {
  auto phases_with = [](double forward_clock, int64_t forward_samples, double backward_clock) {
    PhaseGpuStates phases{};
    phases[static_cast<size_t>(Phase::forward)] = {forward_samples, forward_clock, 600};
    phases[static_cast<size_t>(Phase::backward)] = {4, backward_clock, 700};
    return phases;
  };
  std::vector<GatheredStep> steps = {
      step_of(true, false, {rank_state(10, 500, 400, 100, 95, 0.0, 0)}),  // warm-up: left out
      step_of(false, false, {rank_state(10, 1700, 1500, 700, 61, 1.0, 0x4)}),
      step_of(false, false, {rank_state(10, 1700, 1500, 700, 61, 1.0, 0x4)}),
      step_of(false, false, {rank_state(10, 1700, 1500, 700, 61, 1.0, 0x4)}),
  };
  steps[0].gpu_phases = {phases_with(100, 3, 100)};
  steps[1].gpu_phases = {phases_with(1800, 3, 1600)};
  steps[2].gpu_phases = {phases_with(1790, 2, 1620)};
  steps[3].gpu_phases = {phases_with(kNaN, 0, 1610)};  // no sample in forward: left out, not NaN
  const GpuStateSummary s = summarize_gpu_state(steps);
  EXPECT_EQ(s.phase_sm_clock_median_mhz[static_cast<size_t>(Phase::forward)], 1795.0) << "median of 1800 and 1790";
  EXPECT_EQ(s.phase_sm_clock_median_mhz[static_cast<size_t>(Phase::backward)], 1610.0);
  EXPECT_TRUE(std::isnan(s.phase_sm_clock_median_mhz[static_cast<size_t>(Phase::optimizer)])) << "never sampled";
}

TEST(GpuStateSummary, RunsWithoutSamplesSummariseToNone) {
  const std::vector<GatheredStep> steps = {step_of(false, false, {StepGpuState{}, StepGpuState{}})};
  const GpuStateSummary s = summarize_gpu_state(steps);
  EXPECT_EQ(s.samples, 0);
  EXPECT_TRUE(std::isnan(s.sm_clock_median_mhz) && std::isnan(s.power_capped));
}

}  // namespace
}  // namespace scalestudy
