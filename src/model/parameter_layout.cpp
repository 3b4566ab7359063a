#include "model/parameter_layout.h"

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

}  // namespace scalestudy
