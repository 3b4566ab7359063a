#pragma once
// The energy of one call of a piece of GPU work, for op_timings: the work repeated for
// about a second, the GPU's power read through NVML every 5 ms, and the mean power of the
// samples after the first 0.3 s (once the power, and at the cap the clock, have settled)
// times the time per call. On a power-capped GPU the step lasts about its energy over the
// cap, so what a change saves in energy, not in time alone, is what the step gains.
// Enabled by OP_TIMINGS_ENERGY; without it, or without NVML, the suffix is empty.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/nvml_telemetry.h"
#include "cuda_check.h"
#include "profile/gpu_state.h"

namespace scalestudy::gpu_test {

inline GpuTelemetry* energy_telemetry() {
  static const std::unique_ptr<GpuTelemetry> telemetry = [] {
    std::unique_ptr<GpuTelemetry> made;
    if (std::getenv("OP_TIMINGS_ENERGY") == nullptr) return made;
    int device = 0;
    CHECK_CUDA(cudaGetDevice(&device));
    std::string why_not;
    made = make_nvml_telemetry(device, std::chrono::milliseconds(5), why_not);
    if (!made) std::printf("  (no energy: %s)\n", why_not.c_str());
    return made;
  }();
  return telemetry.get();
}

// What one call of a piece of GPU work costs, run for about a second.
struct CallEnergy {
  double power_w = 0.0;       // mean of the settled samples
  double sm_clock_mhz = 0.0;  // mean of the settled samples
  double mj_per_call = 0.0;   // power_w times the time a call
};

// The energy of `work`, which takes about ms_per_call on `stream`; nothing when energy is
// not measured or no power sample settled.
inline std::optional<CallEnergy> energy_per_call(cudaStream_t stream, double ms_per_call,
                                                 const std::function<void()>& work) {
  GpuTelemetry* telemetry = energy_telemetry();
  if (telemetry == nullptr || !(ms_per_call > 0.0)) return std::nullopt;
  constexpr double kLoopSeconds = 1.0, kSettleSeconds = 0.3;
  const int calls = std::max(1, static_cast<int>(kLoopSeconds * 1e3 / ms_per_call));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  (void)telemetry->take_samples();
  const auto begin = std::chrono::steady_clock::now();
  for (int call = 0; call < calls; ++call) work();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const auto end = std::chrono::steady_clock::now();
  // The settled samples, summarised as a step's are (profile/gpu_state.h).
  std::vector<GpuSample> settled;
  const auto settled_from = begin + std::chrono::duration<double>(kSettleSeconds);
  for (const GpuSample& sample : telemetry->take_samples())
    if (sample.taken_at >= settled_from && sample.taken_at <= end) settled.push_back(sample);
  const StepGpuState state = summarize_gpu_samples(settled);
  if (!(state.power_w > 0.0)) return std::nullopt;
  const double seconds_per_call = std::chrono::duration<double>(end - begin).count() / calls;
  return CallEnergy{state.power_w, state.sm_clock_mhz, state.power_w * seconds_per_call * 1e3};
}

// ", <W> W at <MHz> MHz, <mJ> mJ a call" for `work`, as energy_per_call measures it; empty
// when energy is not measured.
inline std::string energy_suffix(cudaStream_t stream, double ms_per_call,
                                 const std::function<void()>& work) {
  if (energy_telemetry() == nullptr || !(ms_per_call > 0.0)) return {};
  const std::optional<CallEnergy> energy = energy_per_call(stream, ms_per_call, work);
  if (!energy) return ", no power samples";
  char text[96];
  std::snprintf(text, sizeof(text), ", %.0f W at %.0f MHz, %.4g mJ a call", energy->power_w,
                energy->sm_clock_mhz, energy->mj_per_call);
  return text;
}

}  // namespace scalestudy::gpu_test
