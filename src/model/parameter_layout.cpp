#include "model/parameter_layout.h"

#include <cmath>
#include <string>

namespace scalestudy {

ParameterLayout make_parameter_layout(const ModelShape& shape) {
  ParameterLayout layout;
  layout.shape = shape;
  const size_t C = static_cast<size_t>(shape.channels);
  size_t cursor = 0;
  int segment = 0;
  auto add = [&](const std::string& name, size_t elems, bool decay) {
    layout.tensors.push_back({name, cursor, elems, decay, segment});
    cursor += elems;
    return cursor - elems;
  };
  auto close_segment = [&](size_t begin) {
    layout.segments.push_back({begin, cursor});
    ++segment;
  };

  size_t segment_begin = cursor;
  layout.wte = add("wte", static_cast<size_t>(shape.vocab) * C, true);
  layout.wpe = add("wpe", static_cast<size_t>(shape.max_seq) * C, true);
  close_segment(segment_begin);

  for (int l = 0; l < shape.layers; ++l) {
    segment_begin = cursor;
    const std::string p = "block" + std::to_string(l) + ".";
    BlockOffsets b{};
    b.ln1_weight = add(p + "ln1.weight", C, false);
    b.ln1_bias = add(p + "ln1.bias", C, false);
    b.qkv_weight = add(p + "qkv.weight", 3 * C * C, true);
    b.qkv_bias = add(p + "qkv.bias", 3 * C, false);
    b.attn_proj_weight = add(p + "attn_proj.weight", C * C, true);
    b.attn_proj_bias = add(p + "attn_proj.bias", C, false);
    b.ln2_weight = add(p + "ln2.weight", C, false);
    b.ln2_bias = add(p + "ln2.bias", C, false);
    b.fc_weight = add(p + "fc.weight", 4 * C * C, true);
    b.fc_bias = add(p + "fc.bias", 4 * C, false);
    b.fc_proj_weight = add(p + "fc_proj.weight", 4 * C * C, true);
    b.fc_proj_bias = add(p + "fc_proj.bias", C, false);
    layout.blocks.push_back(b);
    close_segment(segment_begin);
  }

  segment_begin = cursor;
  layout.lnf_weight = add("lnf.weight", C, false);
  layout.lnf_bias = add("lnf.bias", C, false);
  close_segment(segment_begin);

  layout.param_elems = cursor;
  return layout;
}

namespace {

// Box-Muller over a splitmix64 stream: defined here rather than by <random>, whose
// distributions differ between standard libraries.
class NormalGenerator {
 public:
  explicit NormalGenerator(uint64_t seed) : state_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double two_pi = 6.283185307179586;
    double u1 = uniform(), u2 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(two_pi * u2);
    has_spare_ = true;
    return radius * std::cos(two_pi * u2);
  }

 private:
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace

std::vector<float> initial_parameters(const ParameterLayout& layout, size_t padded_elems, uint64_t seed) {
  std::vector<float> host(padded_elems, 0.0f);
  NormalGenerator normal(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * layout.shape.layers);
  for (const TensorSpec& tensor : layout.tensors) {
    const bool is_norm_weight = tensor.name.find("ln") != std::string::npos &&
                                tensor.name.find(".weight") != std::string::npos;
    const bool is_residual_proj = tensor.name.find("proj.weight") != std::string::npos;
    float* out = host.data() + tensor.offset_elems;
    if (is_norm_weight) {
      for (size_t i = 0; i < tensor.elems; ++i) out[i] = 1.0f;
    } else if (tensor.decay) {
      const double stddev = is_residual_proj ? residual_std : 0.02;
      for (size_t i = 0; i < tensor.elems; ++i) out[i] = static_cast<float>(stddev * normal.next());
    }
  }
  return host;
}

}  // namespace scalestudy
