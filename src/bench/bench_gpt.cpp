#include "bench/bench_gpt.h"

#include "model/parameter_layout.h"

namespace scalestudy {
namespace {

// splitmix64: the same sequence on every platform, and fast enough for 10^8 values.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<float> random_nonzero(size_t elems, uint64_t seed) {
  std::vector<float> values(elems);
  uint64_t state = seed;
  for (float& value : values) {
    const uint64_t bits = next_random(state);
    const float magnitude = 0.25f + 0.75f * static_cast<float>(bits >> 40) * 0x1.0p-24f;
    value = (bits & 1) ? magnitude : -magnitude;
  }
  return values;
}

float* allocate_random(DeviceMemory& memory, size_t elems, MemoryKind kind, uint64_t seed) {
  float* buffer = memory.allocate_floats(elems, kind);
  const std::vector<float> values = random_nonzero(elems, seed);
  memory.copy_from_host(buffer, values.data(), elems);
  return buffer;
}

std::vector<int32_t> random_tokens(size_t count, int vocab, uint64_t seed) {
  std::vector<int32_t> tokens(count);
  uint64_t state = seed;
  for (int32_t& token : tokens) token = static_cast<int32_t>(next_random(state) % static_cast<uint64_t>(vocab));
  return tokens;
}

FlatGradients::FlatGradients(DeviceMemory& memory, const Gpt& model) : memory_(memory), model_(model) {
  grads_ = memory_.allocate_floats(model_.padded_param_elems(), MemoryKind::gradients);
  memory_.fill_zero(grads_, model_.padded_param_elems());
}

FlatGradients::~FlatGradients() { memory_.release(grads_); }

float* FlatGradients::tensor_gradients(size_t tensor_begin_elems) { return grads_ + tensor_begin_elems; }

// The parameters are fp32 master weights (MemoryKind::parameters), so copying them in is
// exact on every backend; a backend that computes from a lower-precision copy of them
// refreshes it in parameters_changed.
void ParameterCache::initialize(Backend& backend, float* params, const ParameterLayout& layout, size_t elems) {
  if (host_params_.size() != elems) host_params_ = initial_parameters(layout, elems, seed_);
  backend.copy_from_host(params, host_params_.data(), elems);
  backend.parameters_changed(params, 0, elems);
}

}  // namespace scalestudy
