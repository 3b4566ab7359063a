#pragma once
// What the layer and inference benchmarks need around scalestudy::Gpt: a gradient buffer
// for backward, parameters initialised once and reused by every point, random tokens,
// and random non-zero fills of backend buffers.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/gpt.h"

namespace scalestudy {

// Uniform values in ±[0.25, 1): random and never zero, so that no kernel meets the
// zeros it might take a faster path on (or draw less power for).
std::vector<float> random_nonzero(size_t elems, uint64_t seed);
// A backend buffer of `elems` floats of `kind`, filled with random_nonzero values.
float* allocate_random(DeviceMemory& memory, size_t elems, MemoryKind kind, uint64_t seed);
// Token ids uniform in [0, vocab).
std::vector<int32_t> random_tokens(size_t count, int vocab, uint64_t seed);

// One flat gradient buffer for the whole model, zeroed once: backward accumulates into
// it call after call, which costs what zeroing per call would not add to the timing.
class FlatGradients final : public GradientSink {
 public:
  FlatGradients(DeviceMemory& memory, const Gpt& model);
  ~FlatGradients() override;
  FlatGradients(const FlatGradients&) = delete;
  FlatGradients& operator=(const FlatGradients&) = delete;
  float* tensor_gradients(size_t tensor_begin_elems) override;
  void segment_done(int) override {}

 private:
  DeviceMemory& memory_;
  const Gpt& model_;
  float* grads_ = nullptr;
};

// GPT-2 initialisation draws every parameter on the host, which takes seconds at BERT
// size; every point of a benchmark has the same shape, so the first point's parameters
// are kept and copied into the later ones. Tells the backend they changed.
class ParameterCache {
 public:
  explicit ParameterCache(uint64_t seed) : seed_(seed) {}
  // The `elems` parameters at `params` (a model's, laid out as `layout` says).
  void initialize(Backend& backend, float* params, const ParameterLayout& layout, size_t elems);
  void initialize(Backend& backend, Gpt& model) {
    initialize(backend, model.params(), model.layout(), model.padded_param_elems());
  }

 private:
  uint64_t seed_;
  std::vector<float> host_params_;
};

}  // namespace scalestudy
