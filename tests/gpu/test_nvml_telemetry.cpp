// The NVML sampler (src/backend/cuda/nvml_telemetry.h) on GPU 0 while it multiplies
// matrices: it loads, keeps up with its period, and reads values a working GPU can have.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/nvml_telemetry.h"

namespace scalestudy {
namespace {

TEST(NvmlTelemetry, SamplesABusyGpuAtItsPeriod) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
  CudaOps ops(0, Precision::fp32);
  constexpr int kSize = 4096;
  const size_t elems = static_cast<size_t>(kSize) * kSize;
  float* a = ops.allocate_floats(elems, MemoryKind::other);
  float* w = ops.allocate_floats(elems, MemoryKind::other);
  float* out = ops.allocate_floats(elems, MemoryKind::other);
  ops.fill_zero(a, elems);
  ops.fill_zero(w, elems);

  constexpr auto kPeriod = std::chrono::milliseconds(5);
  std::string why_not;
  const auto telemetry = make_nvml_telemetry(0, kPeriod, why_not);
  ASSERT_NE(telemetry, nullptr) << why_not;
  (void)telemetry->take_samples();  // the idle GPU before the work
  const auto begin = std::chrono::steady_clock::now();
  double elapsed_s = 0.0;
  while (elapsed_s < 0.5) {
    for (int i = 0; i < 20; ++i) ops.matmul_forward(out, a, w, nullptr, kSize, kSize, kSize);
    ops.synchronize();
    elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }
  const auto end = std::chrono::steady_clock::now();
  const std::vector<GpuSample> samples = telemetry->take_samples();
  const StepGpuState busy = summarize_gpu_samples(samples);
  std::printf("NVML: %lld samples in %.3f s (period %lld ms): SM clock %.0f MHz (lowest %.0f), power %.0f W, "
              "%.0f C, power-capped %.2f, reasons 0x%llx\n",
              static_cast<long long>(busy.samples), elapsed_s, static_cast<long long>(kPeriod.count()),
              busy.sm_clock_mhz, busy.sm_clock_min_mhz, busy.power_w, busy.temperature_c, busy.power_capped,
              static_cast<unsigned long long>(busy.clock_event_reasons));
  // At most one sample per period; at least half as many, or the reads are slower than
  // the period and a step's figures rest on fewer samples than --gpu-telemetry-ms says.
  const double periods = elapsed_s / (kPeriod.count() / 1000.0);
  EXPECT_LE(busy.samples, periods + 2);
  EXPECT_GE(busy.samples, 0.5 * periods);
  // Ranges any data-centre GPU at work stays in: its SM clock, board power, temperature.
  EXPECT_GE(busy.sm_clock_min_mhz, 200.0);
  EXPECT_LE(busy.sm_clock_min_mhz, busy.sm_clock_mhz);
  EXPECT_LE(busy.sm_clock_mhz, 3000.0);
  EXPECT_GE(busy.power_w, 50.0) << "instantaneous power of a GPU multiplying fp32 matrices";
  EXPECT_LE(busy.power_w, 1500.0);
  EXPECT_GE(busy.temperature_c, 10.0);
  EXPECT_LE(busy.temperature_c, 110.0);
  EXPECT_GE(busy.power_capped, 0.0);
  EXPECT_LE(busy.power_capped, 1.0);
  EXPECT_EQ(busy.clock_event_reasons & 0x1, 0) << "the GPU was never idle while it multiplied";
  // Each sample carries the host time it was taken at, in order, on the clock the step's
  // phases are placed on; the first may predate the work by one period.
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_GE(samples[i].taken_at, begin - kPeriod) << "sample " << i;
    EXPECT_LE(samples[i].taken_at, end) << "sample " << i;
    if (i > 0) {
      EXPECT_GT(samples[i].taken_at, samples[i - 1].taken_at) << "sample " << i;
    }
  }

  // take_samples hands over what it has: right after one, at most a sample or two are in.
  EXPECT_LE(telemetry->take_samples().size(), 2u);
  for (float* p : {a, w, out}) ops.release(p);
}

}  // namespace
}  // namespace scalestudy
