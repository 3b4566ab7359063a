#pragma once
// The parameters that the ops of every backend and the CUDA kernels under them share:
// how a backward op writes its input's gradient, the attention's shape, and AdamW's
// hyper-parameters.
#include <cstddef>

namespace scalestudy {

// How a backward op writes the gradient of its input. accumulate: dinp += the
// gradient. overwrite: dinp = the gradient, and dinp's old contents are never read (they
// may be anything, NaN included); on every backend the result equals accumulating into
// a zeroed buffer.
enum class GradientWrite { accumulate, overwrite };

struct AttentionShape {
  int batch = 0;      // B
  int seq = 0;        // T
  int channels = 0;   // C
  int heads = 0;      // NH; head size is C / NH
  bool causal = true; // false: bidirectional (BERT-style)
};

// The elements of the attention probabilities [B,NH,T,T].
inline size_t attention_probs_elems(const AttentionShape& shape) {
  return static_cast<size_t>(shape.batch) * shape.heads * shape.seq * shape.seq;
}

struct AdamWParams {
  float learning_rate = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;  // decoupled; 0 for tensors that are not decayed
  int step = 1;               // 1-based, for bias correction
};

// A piece [begin_elems, end_elems) of a range that adamw_update_pieces updates, offsets
// from the range's start, with the weight decay of its tensor (0 for one not decayed).
struct AdamWPiece {
  size_t begin_elems = 0;
  size_t end_elems = 0;
  float weight_decay = 0.0f;
  bool operator==(const AdamWPiece& other) const {
    return begin_elems == other.begin_elems && end_elems == other.end_elems &&
           weight_decay == other.weight_decay;
  }
};

}  // namespace scalestudy
