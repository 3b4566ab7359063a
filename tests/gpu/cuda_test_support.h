#pragma once
// What the GPU op tests share: seeded random inputs, the tolerance check that prints the
// first mismatch, the op shapes, a fixture that owns a CudaOps of a given precision and
// the device buffers a test uploads, and a whole-model gradient sink.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_info.h"
#include "model/gpt.h"
#include "model/parameter_layout.h"

namespace scalestudy::gpu_test {

// |gpu - ref| <= atol + rtol*|ref|, element by element.
struct Tolerance {
  double atol;
  double rtol;
};

// splitmix64: the same sequence with every compiler and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(next() >> 40) * 0x1.0p-24);
  }

 private:
  uint64_t state_;
};

inline std::vector<float> random_floats(size_t elems, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> values(elems);
  for (float& value : values) value = rng.uniform(lo, hi);
  return values;
}

// Ids in [0, bound), half of them from {0..4} so that repeated tokens are certain, and
// the last one bound-1 so that the top row of a table is touched.
inline std::vector<int32_t> random_ids(size_t elems, uint64_t seed, int32_t bound) {
  Rng rng(seed);
  std::vector<int32_t> ids(elems);
  for (size_t i = 0; i < elems; ++i) {
    const int32_t range = i % 2 == 0 ? std::min<int32_t>(bound, 5) : bound;
    ids[i] = static_cast<int32_t>(rng.next() % static_cast<uint64_t>(range));
  }
  ids.back() = bound - 1;
  return ids;
}

// On success the message (see ::testing::AssertionResult::message) holds the largest
// |error| / (atol + rtol*|ref|): the fraction of the bound used, for reporting margins.
template <class Got, class Ref>
::testing::AssertionResult all_close(const std::string& what, const Got& got, const Ref& ref,
                                     Tolerance tolerance) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " vs " << ref.size()
                                         << " elements";
  size_t mismatches = 0, first = 0;
  double worst = 0.0, worst_fraction = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double error = std::fabs(g - r);
    const double bound = tolerance.atol + tolerance.rtol * std::fabs(r);
    if (!(error <= bound)) {
      if (mismatches++ == 0) first = i;
    }
    if (error > worst || std::isnan(error)) worst = error;
    if (bound > 0.0) worst_fraction = std::max(worst_fraction, error / bound);
  }
  if (mismatches == 0) return ::testing::AssertionSuccess() << worst_fraction;
  std::ostringstream text;
  text << std::setprecision(9) << what << ": " << mismatches << " of " << got.size()
       << " elements exceed atol " << tolerance.atol << " + rtol " << tolerance.rtol
       << "*|ref|; first at index " << first << ": gpu " << static_cast<double>(got[first])
       << ", cpu " << static_cast<double>(ref[first]) << "; largest |error| " << worst;
  return ::testing::AssertionFailure() << text.str();
}

struct OpShape {
  const char* name;
  int batch, seq, channels, heads, vocab;
  int rows() const { return batch * seq; }
};

// A medium shape, an odd one (T=33, C=96, V=517: no dimension a multiple of a tile or
// warp) and a tiny one (head size 3), to catch tail handling.
inline constexpr OpShape kShapes[] = {
    {"medium", 2, 64, 128, 4, 1000},
    {"odd", 3, 33, 96, 4, 517},
    {"tiny", 1, 5, 6, 2, 11},
};

// Both ways a backward op writes its input gradient. The overwrite runs start the GPU's
// input gradient as NaN, which the op must never read.
inline constexpr GradientWrite kGradientWrites[] = {GradientWrite::accumulate,
                                                    GradientWrite::overwrite};
inline std::string write_label(GradientWrite write) {
  return write == GradientWrite::accumulate ? " (accumulate)" : " (overwrite)";
}

// Owns a CudaOps of the given precision (skipping the test without a GPU) and every
// device buffer a test uploads.
class CudaOpsFixture : public ::testing::Test {
 protected:
  explicit CudaOpsFixture(Precision precision) : precision_(precision) {}
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: GPU tests skipped";
    gpu_ = std::make_unique<CudaOps>(0, precision_);
  }
  void TearDown() override {
    if (!gpu_) return;
    for (void* ptr : owned_) gpu_->release(ptr);
  }

  // In bf16 or fp16 mode an activations buffer stores 16-bit values: copy_from_host
  // rounds them (fp16: to +-inf beyond 65504).
  float* upload(const std::vector<float>& host, MemoryKind kind = MemoryKind::other) {
    float* device = gpu_->allocate_floats(host.size(), kind);
    owned_.push_back(device);
    gpu_->copy_from_host(device, host.data(), host.size());
    return device;
  }
  int32_t* upload(const std::vector<int32_t>& host) {
    int32_t* device = gpu_->allocate_ints(host.size(), MemoryKind::other);
    owned_.push_back(device);
    gpu_->copy_ints_from_host(device, host.data(), host.size());
    return device;
  }
  // A device output buffer that the op must overwrite completely.
  float* poisoned(size_t elems, MemoryKind kind = MemoryKind::other) {
    return upload(std::vector<float>(elems, NAN), kind);
  }
  std::vector<float> download(const float* device, size_t elems) {
    std::vector<float> host(elems);
    gpu_->copy_to_host(host.data(), device, elems);
    return host;
  }
  ::testing::AssertionResult matches(const std::string& what, const float* device,
                                     const std::vector<float>& cpu, Tolerance tolerance) {
    return all_close(what, download(device, cpu.size()), cpu, tolerance);
  }

  Precision precision_;
  CpuOps cpu_;
  std::unique_ptr<CudaOps> gpu_;
  std::vector<void*> owned_;
};

// One gradient buffer for the whole model (as ddp uses), on whichever backend owns it.
class FullGradient : public GradientSink {
 public:
  explicit FullGradient(float* grads) : grads_(grads) {}
  float* tensor_gradients(size_t tensor_begin_elems) override { return grads_ + tensor_begin_elems; }
  void segment_done(int) override {}

 private:
  float* grads_;
};

}  // namespace scalestudy::gpu_test
