#include "bench/bench_model.h"

#include "model/gpt.h"
#include "model/parameter_layout.h"

namespace scalestudy::bench_model {
namespace {

constexpr double A = kActivationBytes;

// An input gradient that accumulates is read and written; one that is overwritten is
// only written.
double input_gradient_passes(bool accumulate) { return accumulate ? 2.0 : 1.0; }

}  // namespace

// ---- ops: (elements read + elements written) × bytes ----------------------------------------

// Reads the token ids, the N gathered rows of wte and the T rows of wpe; writes N×C.
double embedding_forward_bytes(double b, double t, double c) {
  const double n = b * t;
  return kTokenBytes * n + A * (n * c + t * c + n * c);
}

// Reads dout and the ids; accumulates into the N rows of dwte and the T rows of dwpe.
double embedding_backward_bytes(double b, double t, double c) {
  const double n = b * t;
  return kTokenBytes * n + A * (n * c + 2 * n * c + 2 * t * c);
}

// Reads the input, weight and bias; writes the output and the per-row mean and rstd.
double layernorm_forward_bytes(double rows, double c) { return A * (2 * rows * c + 2 * c + 2 * rows); }

// Reads dout, the input, the weight, mean and rstd; writes dinp; accumulates dweight and
// dbias.
double layernorm_backward_bytes(double rows, double c, bool accumulate_dinp) {
  return A * (2 * rows * c + c + 2 * rows + input_gradient_passes(accumulate_dinp) * rows * c +
              4 * c);
}

double matmul_forward_bytes(double rows, double in, double out, bool bias) {
  return A * (rows * in + out * in + (bias ? out : 0.0) + rows * out);
}

// Reads dout, the input and the weight; writes dinp; accumulates dweight and dbias.
double matmul_backward_bytes(double rows, double in, double out, bool bias, bool accumulate_dinp) {
  return A * (rows * out + rows * in + out * in + input_gradient_passes(accumulate_dinp) * rows * in +
              2 * out * in + (bias ? 2 * out : 0.0));
}

// Reads qkv [B,T,3C]; writes the output [B,T,C] and the probabilities [B,NH,T,T].
double attention_forward_bytes(double b, double t, double c, double heads) {
  return A * (3 * b * t * c + b * t * c + b * heads * t * t);
}

// Reads dout, qkv and the probabilities; writes dqkv.
double attention_backward_bytes(double b, double t, double c, double heads, bool accumulate_dqkv) {
  return A * (b * t * c + 3 * b * t * c + b * heads * t * t +
              input_gradient_passes(accumulate_dqkv) * 3 * b * t * c);
}

double gelu_forward_bytes(double elems) { return A * 2 * elems; }
// Reads inp and dout; writes dinp.
double gelu_backward_bytes(double elems, bool accumulate_dinp) {
  return A * (2 + input_gradient_passes(accumulate_dinp)) * elems;
}
// Reads the input, weight and bias; writes pre and out, with no read of pre between them.
double dense_gelu_forward_bytes(double rows, double in, double out) {
  return A * (rows * in + out * in + out + 2 * rows * out);
}

// Reads dout, the dense layer's input act and weight, and pre; writes dpre (overwritten);
// accumulates dweight and dbias. The gradient of act never reaches memory.
double dense_backward_through_gelu_bytes(double rows, double in, double out) {
  return A * (rows * out + rows * in + out * in + rows * in + rows * in + 2 * out * in + 2 * out);
}

// The residual stream's add in the projection's GEMM (MatmulForwardArgs::residual): one
// more read, of the stream; the sum is the layer's own write.
double residual_add_bytes(double elems) { return A * elems; }
double accumulate_bytes(double elems) { return A * 3 * elems; }
double fill_zero_bytes(double elems) { return A * elems; }

// Reads the logits and targets; writes the per-row losses and statistics (max, 1/sum).
double softmax_cross_entropy_forward_bytes(double rows, double vocab) {
  return A * (rows * vocab + 3 * rows) + kTokenBytes * rows;
}

// Reads the logits, their statistics and the targets; writes dlogits (in place).
double softmax_cross_entropy_backward_bytes(double rows, double vocab) {
  return A * (2 * rows * vocab + 2 * rows) + kTokenBytes * rows;
}

// ---- the model: the op sequence of Gpt::forward and Gpt::backward -------------------------

double gpt_forward_bytes(const ModelShape& s, double b, double t) {
  const double n = b * t, c = s.channels, v = s.vocab, h = s.heads;
  const double block = layernorm_forward_bytes(n, c) + matmul_forward_bytes(n, c, 3 * c, true) +
                       attention_forward_bytes(b, t, c, h) + matmul_forward_bytes(n, c, c, true) +
                       residual_add_bytes(n * c) + layernorm_forward_bytes(n, c) +
                       dense_gelu_forward_bytes(n, c, 4 * c) +
                       matmul_forward_bytes(n, 4 * c, c, true) + residual_add_bytes(n * c);
  return embedding_forward_bytes(b, t, c) + s.layers * block + layernorm_forward_bytes(n, c) +
         matmul_forward_bytes(n, c, v, false) + softmax_cross_entropy_forward_bytes(n, v);
}

double gpt_backward_bytes(const ModelShape& s, double b, double t) {
  const double n = b * t, c = s.channels, v = s.vocab, h = s.heads;
  // Every input gradient is overwritten by its one writer, except the residual stream's,
  // which the blocks' LayerNorm backwards accumulate.
  const double head = softmax_cross_entropy_backward_bytes(n, v) +
                      matmul_backward_bytes(n, c, v, false, false) +
                      layernorm_backward_bytes(n, c, false);
  const double block = dense_backward_through_gelu_bytes(n, 4 * c, c) +
                       matmul_backward_bytes(n, c, 4 * c, true, false) +
                       layernorm_backward_bytes(n, c, true) +
                       matmul_backward_bytes(n, c, c, true, false) +
                       attention_backward_bytes(b, t, c, h, false) +
                       matmul_backward_bytes(n, c, 3 * c, true, false) +
                       layernorm_backward_bytes(n, c, true);
  return head + s.layers * block + embedding_backward_bytes(b, t, c);
}

// ---- parts ----------------------------------------------------------------------------------

const char* part_name(Part part) {
  switch (part) {
    case Part::ffn_dense: return "ffn-dense";
    case Part::ffn_dense_gelu: return "ffn-dense-gelu";
    case Part::ffn: return "ffn";
    case Part::attention: return "attention";
    case Part::attention_core: return "attention-core";
  }
  return "?";
}

const char* part_description(Part part) {
  switch (part) {
    case Part::ffn_dense: return "the FFN's first dense layer, C -> 4C with bias";
    case Part::ffn_dense_gelu: return "that dense layer followed by the GELU";
    case Part::ffn:
      return "the whole FFN as the model runs it: dense C -> 4C with the GELU (dense_gelu_forward), then "
             "dense 4C -> C; backward: dense_backward_through_gelu, then the first dense layer's backward";
    case Part::attention: return "the attention sub-layer: QKV projection, attention, output projection";
    case Part::attention_core: return "attention alone: softmax(QK^T/sqrt(d)) V from the packed qkv";
  }
  return "?";
}

double part_forward_flops(Part part, const ModelShape& s, double b, double t) {
  const double n = b * t, c = s.channels;
  switch (part) {
    case Part::ffn_dense:
    case Part::ffn_dense_gelu: return 8 * n * c * c;
    case Part::ffn: return 16 * n * c * c;
    case Part::attention: return 8 * n * c * c + 4 * b * t * t * c;
    case Part::attention_core: return 4 * b * t * t * c;
  }
  return 0.0;
}

double part_forward_bytes(Part part, const ModelShape& s, double b, double t) {
  const double n = b * t, c = s.channels, h = s.heads;
  switch (part) {
    case Part::ffn_dense: return matmul_forward_bytes(n, c, 4 * c, true);
    case Part::ffn_dense_gelu: return matmul_forward_bytes(n, c, 4 * c, true) + gelu_forward_bytes(4 * n * c);
    case Part::ffn: return dense_gelu_forward_bytes(n, c, 4 * c) + matmul_forward_bytes(n, 4 * c, c, true);
    case Part::attention:
      return matmul_forward_bytes(n, c, 3 * c, true) + attention_forward_bytes(b, t, c, h) +
             matmul_forward_bytes(n, c, c, true);
    case Part::attention_core: return attention_forward_bytes(b, t, c, h);
  }
  return 0.0;
}

double part_backward_bytes(Part part, const ModelShape& s, double b, double t) {
  const double n = b * t, c = s.channels, h = s.heads;
  switch (part) {
    // As in the model, each part's input gradients are overwritten.
    case Part::ffn_dense: return matmul_backward_bytes(n, c, 4 * c, true, false);
    case Part::ffn_dense_gelu:
      return gelu_backward_bytes(4 * n * c, false) + matmul_backward_bytes(n, c, 4 * c, true, false);
    case Part::ffn:
      return dense_backward_through_gelu_bytes(n, 4 * c, c) + matmul_backward_bytes(n, c, 4 * c, true, false);
    case Part::attention:
      return matmul_backward_bytes(n, c, c, true, false) +
             attention_backward_bytes(b, t, c, h, false) +
             matmul_backward_bytes(n, c, 3 * c, true, false);
    case Part::attention_core: return attention_backward_bytes(b, t, c, h, false);
  }
  return 0.0;
}

// ---- memory ---------------------------------------------------------------------------------

size_t gpt_allocation_bytes(const Backend& backend, const ModelShape& shape, int batch, int seq, bool backward) {
  const size_t param_elems = make_parameter_layout(shape).param_elems;
  size_t bytes = Gpt::parameter_bytes(backend, param_elems) +
                 Gpt::activation_bytes(backend, shape, batch, seq, /*recompute=*/false);
  if (backward)
    bytes += backend.floats_bytes(param_elems, MemoryKind::gradients) + backend.model_scratch_bytes(shape, batch, seq);
  return bytes;
}

}  // namespace scalestudy::bench_model
