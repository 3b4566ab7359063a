#pragma once
// What the GPU op tests share: seeded random inputs and the tolerance check of
// op_checks.h, random ids, the op shapes, a fixture that owns a CudaOps of a given
// precision and the device buffers a test uploads, and a whole-model gradient sink.
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
#include "op_checks.h"

namespace scalestudy::gpu_test {

using op_test::all_close;
using op_test::random_floats;
using op_test::Rng;
using op_test::Tolerance;

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

// The dense layers a transformer runs, at a test shape: the QKV projection, the MLP's
// down projection, and the bias-free tied LM head.
struct DenseCase {
  int in_channels, out_channels;
  bool bias;
  std::string label() const {
    return " (" + std::to_string(in_channels) + "->" + std::to_string(out_channels) +
           (bias ? ", bias)" : ", no bias)");
  }
};
inline std::vector<DenseCase> dense_cases(const OpShape& s) {
  return {{s.channels, 3 * s.channels, true}, {4 * s.channels, s.channels, true}, {s.channels, s.vocab, false}};
}

// Causal attention probabilities [rows, T] that are not exact zeros above the diagonal
// (key t2 > query t); every one of them is a masking error.
inline size_t unmasked_probabilities(const std::vector<float>& probs, size_t seq) {
  size_t unmasked = 0;
  for (size_t row = 0; row < probs.size() / seq; ++row)
    for (size_t t2 = row % seq + 1; t2 < seq; ++t2) unmasked += probs[row * seq + t2] != 0.0f;
  return unmasked;
}

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
