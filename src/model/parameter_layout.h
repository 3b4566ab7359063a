#pragma once
// Where every parameter lives in the one flat buffer, and the values it starts from.
// Tensors are views into it; the strategies cut buckets and shards by arithmetic on these
// offsets alone.
//
// Order: wte, wpe, then block 0 .. L-1, then the final LayerNorm. Backward finishes
// gradients from the end of the buffer towards the start (final LayerNorm, block L-1,
// ..., block 0, and last the embeddings, whose tied wte also collects the LM head's
// gradient, from its last rows down), so buckets taken from the end fill up in the order
// backward produces them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/model_shape.h"

namespace scalestudy {

struct TensorSpec {
  std::string name;      // e.g. "block3.fc.weight"
  size_t offset_elems = 0;
  size_t elems = 0;
  bool decay = false;    // weight decay applies to matrices only
  int segment = 0;
};

// A contiguous run of tensors whose gradients backward finishes together: the
// embeddings (segment 0), each block (1..L), the final LayerNorm (L+1).
struct Segment {
  size_t begin_elems = 0;
  size_t end_elems = 0;
  size_t elems() const { return end_elems - begin_elems; }
};

// Offsets of one block's tensors, relative to the start of the flat buffer.
struct BlockOffsets {
  size_t ln1_weight, ln1_bias, qkv_weight, qkv_bias, attn_proj_weight, attn_proj_bias;
  size_t ln2_weight, ln2_bias, fc_weight, fc_bias, fc_proj_weight, fc_proj_bias;
};

struct ParameterLayout {
  ModelShape shape;
  std::vector<TensorSpec> tensors;
  std::vector<Segment> segments;
  std::vector<BlockOffsets> blocks;
  size_t wte = 0, wpe = 0, lnf_weight = 0, lnf_bias = 0;
  size_t param_elems = 0;  // the model's parameters, unpadded

  int embedding_segment() const { return 0; }
  int block_segment(int layer) const { return 1 + layer; }
  int final_norm_segment() const { return shape.layers + 1; }
};

ParameterLayout make_parameter_layout(const ModelShape& shape);

// Calls visit(begin_elems, end_elems, decay) for each piece of [begin, end) that falls in
// one tensor, and for the padding beyond the last tensor (decay false).
template <typename Visit>
void for_each_tensor_piece(const ParameterLayout& layout, size_t begin_elems, size_t end_elems,
                           Visit&& visit) {
  size_t cursor = begin_elems;
  for (const TensorSpec& tensor : layout.tensors) {
    const size_t lo = tensor.offset_elems, hi = tensor.offset_elems + tensor.elems;
    if (hi <= cursor) continue;
    if (lo >= end_elems) break;
    const size_t piece_end = hi < end_elems ? hi : end_elems;
    visit(cursor, piece_end, tensor.decay);
    cursor = piece_end;
  }
  if (cursor < end_elems) visit(cursor, end_elems, false);
}

// The model's starting weights, the same on every rank and every backend. GPT-2
// initialisation from a seed, as a host buffer of padded_elems floats: weights N(0, 0.02),
// residual projections N(0, 0.02/sqrt(2L)), biases and padding 0, LayerNorm weights 1.
// The normal draws come from a generator defined here rather than from <random>, whose
// distributions differ between standard libraries.
std::vector<float> initial_parameters(const ParameterLayout& layout, size_t padded_elems, uint64_t seed);

}  // namespace scalestudy
