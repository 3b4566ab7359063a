#include "results/run_summary.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace scalestudy {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<Span> clipped(std::vector<Span> spans, double window_end) {
  for (Span& span : spans) {
    span.begin = std::max(span.begin, 0.0);
    span.end = std::min(span.end, window_end);
  }
  return spans;
}

std::vector<Span> joined(const std::vector<Span>& a, const std::vector<Span>& b) {
  std::vector<Span> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

double median(const std::vector<double>& values) { return quantile(values, 0.5); }

}  // namespace

double union_length(std::vector<Span> spans) {
  spans.erase(std::remove_if(spans.begin(), spans.end(),
                             [](const Span& s) { return !(s.end > s.begin); }),
              spans.end());
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  double total = 0.0, reach = -std::numeric_limits<double>::infinity(), start = 0.0;
  for (const Span& span : spans) {
    if (span.begin > reach) {
      if (reach > start) total += reach - start;
      start = span.begin;
      reach = span.end;
    } else {
      reach = std::max(reach, span.end);
    }
  }
  if (!spans.empty()) total += reach - start;
  return total;
}

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return kNaN;
  std::sort(values.begin(), values.end());
  const double position = q * static_cast<double>(values.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(position));
  const size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (position - static_cast<double>(below)) * (values[above] - values[below]);
}

StepComm step_comm(const PhaseIntervals& intervals, const std::vector<CollectiveRecord>& collectives) {
  const double step_end = intervals[static_cast<int>(Phase::step)].end;
  std::vector<Span> comm, compute, waits;
  for (const CollectiveRecord& c : collectives) {
    comm.push_back({c.begin_s, c.end_s});
    if (!std::isnan(c.wait_begin_s)) waits.push_back({c.wait_begin_s, c.wait_end_s});
  }
  for (Phase phase : {Phase::forward, Phase::backward, Phase::optimizer}) {
    const Interval& interval = intervals[static_cast<int>(phase)];
    if (!interval.empty()) compute.push_back({interval.begin, interval.end});
  }
  comm = clipped(comm, step_end);
  compute = clipped(compute, step_end);
  waits = clipped(waits, step_end);

  const double a = union_length(comm), c = union_length(compute), w = union_length(waits);
  const double ac = union_length(joined(comm, compute)), aw = union_length(joined(comm, waits));
  const double cw = union_length(joined(compute, waits));
  const double acw = union_length(joined(joined(comm, compute), waits));
  const double a_and_c = a + c - ac;
  const double a_and_c_and_w = a + c + w - ac - aw - cw + acw;
  StepComm out;
  out.comm_s = a;
  out.exposed_s = std::max(0.0, a - a_and_c + a_and_c_and_w);
  return out;
}

double step_time(const GatheredStep& step) {
  double slowest = 0.0;
  for (const PhaseIntervals& rank : step.intervals) slowest = std::max(slowest, rank[static_cast<int>(Phase::step)].length());
  return slowest;
}

TracingCost tracing_cost(const std::vector<GatheredStep>& steps) {
  std::vector<double> traced, untraced;
  for (const GatheredStep& step : steps) {
    if (step.traced) traced.push_back(step_time(step));
    else if (!step.warmup) untraced.push_back(step_time(step));
  }
  TracingCost cost;
  double total = 0.0;
  for (double t : traced) total += t;
  cost.traced_step_time_mean_s = traced.empty() ? kNaN : total / static_cast<double>(traced.size());
  cost.untraced_step_time_median_s = untraced.empty() ? kNaN : median(untraced);
  return cost;
}

GpuStateSummary summarize_gpu_state(const std::vector<GatheredStep>& steps) {
  std::vector<double> clocks, powers;
  GpuStateSummary s;
  s.sm_clock_min_mhz = s.temperature_max_c = kNaN;
  double capped_samples = 0.0;
  std::array<std::vector<double>, kPhaseCount> phase_clocks;
  for (const GatheredStep& step : steps) {
    if (step.warmup || step.traced) continue;
    for (const PhaseGpuStates& rank : step.gpu_phases)
      for (int p = 0; p < kPhaseCount; ++p) {
        const PhaseGpuState& phase = rank[static_cast<size_t>(p)];
        if (phase.samples > 0 && !std::isnan(phase.sm_clock_mhz))
          phase_clocks[static_cast<size_t>(p)].push_back(phase.sm_clock_mhz);
      }
    for (const StepGpuState& rank : step.gpu_state) {
      if (rank.samples == 0) continue;
      s.samples += rank.samples;
      s.clock_event_reasons |= rank.clock_event_reasons;
      if (!std::isnan(rank.sm_clock_mhz)) clocks.push_back(rank.sm_clock_mhz);
      if (!std::isnan(rank.power_w)) powers.push_back(rank.power_w);
      // fmin and fmax keep the number where one side is NaN.
      s.sm_clock_min_mhz = std::fmin(s.sm_clock_min_mhz, rank.sm_clock_min_mhz);
      s.temperature_max_c = std::fmax(s.temperature_max_c, rank.temperature_c);
      if (!std::isnan(rank.power_capped)) capped_samples += rank.power_capped * static_cast<double>(rank.samples);
    }
  }
  s.sm_clock_median_mhz = clocks.empty() ? kNaN : median(clocks);
  s.power_median_w = powers.empty() ? kNaN : median(powers);
  s.power_capped = s.samples > 0 ? capped_samples / static_cast<double>(s.samples) : kNaN;
  for (int p = 0; p < kPhaseCount; ++p) {
    const std::vector<double>& clocks_of_phase = phase_clocks[static_cast<size_t>(p)];
    s.phase_sm_clock_median_mhz[static_cast<size_t>(p)] = clocks_of_phase.empty() ? kNaN : median(clocks_of_phase);
  }
  return s;
}

RunSummary summarize(const std::vector<GatheredStep>& steps, int world_size, double flops_per_step,
                     double peak_tflops_per_gpu, const std::string& peak_source) {
  std::vector<double> step_times, tokens, comm_times, exposed_times;
  for (const GatheredStep& step : steps) {
    if (step.warmup || step.traced) continue;
    double comm = 0.0, exposed = 0.0;
    for (size_t r = 0; r < step.intervals.size(); ++r) {
      const StepComm rank_comm = step_comm(step.intervals[r], step.collectives[r]);
      comm = std::max(comm, rank_comm.comm_s);
      exposed = std::max(exposed, rank_comm.exposed_s);
    }
    step_times.push_back(step_time(step));
    tokens.push_back(static_cast<double>(step.tokens));
    comm_times.push_back(comm);
    exposed_times.push_back(exposed);
  }
  RunSummary s;
  s.steps_measured = static_cast<int64_t>(step_times.size());
  s.step_time_median_s = median(step_times);
  s.step_time_q1_s = quantile(step_times, 0.25);
  s.step_time_q3_s = quantile(step_times, 0.75);
  s.tokens_per_s = median(tokens) / s.step_time_median_s;
  s.flops_per_step = flops_per_step;
  s.tflops_per_gpu = flops_per_step / s.step_time_median_s / world_size / 1e12;
  s.peak_tflops_per_gpu = peak_tflops_per_gpu;
  s.peak_source = peak_source;
  s.mfu = std::isnan(peak_tflops_per_gpu) ? kNaN : s.tflops_per_gpu / peak_tflops_per_gpu;
  s.comm_time_median_s = median(comm_times);
  s.exposed_comm_median_s = median(exposed_times);
  s.exposed_comm_fraction = s.comm_time_median_s > 0 ? s.exposed_comm_median_s / s.comm_time_median_s : 0.0;
  s.comm_fraction_of_step = s.comm_time_median_s / s.step_time_median_s;
  return s;
}

}  // namespace scalestudy
