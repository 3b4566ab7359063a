#include "model/gpt_activations.h"

namespace scalestudy {

DenseInputStrides dense_input_strides(const Ops& ops, const ModelShape& model, int micro_batch, int seq) {
  const AttentionShape attention{micro_batch, seq, model.channels, model.heads, model.causal};
  return {.ln = ops.dense_input_stride(model.channels),
          .attention = ops.attention_output_stride(attention),
          .gelu = ops.gelu_output_stride(4 * model.channels)};
}

void lay_out_activations(const ActivationShape& shape, ActivationSource& source, GptActivations& a) {
  const size_t N = static_cast<size_t>(shape.micro_batch) * static_cast<size_t>(shape.seq);
  const size_t C = static_cast<size_t>(shape.model.channels);
  const int channels = shape.model.channels;
  const size_t ln_row_elems = static_cast<size_t>(row_stride(shape.strides.ln, channels));
  const size_t atty_row_elems = static_cast<size_t>(row_stride(shape.strides.attention, channels));
  const size_t gelu_row_elems = static_cast<size_t>(row_stride(shape.strides.gelu, 4 * channels));
  const AttentionShape attention{shape.micro_batch, shape.seq, shape.model.channels, shape.model.heads,
                                 shape.model.causal};
  a.tokens = source.ints(N);
  a.targets = source.ints(N);
  a.encoded = source.floats(N * C);
  GptActivations::Layer shared{};
  for (int l = 0; l < shape.model.layers; ++l) {
    if (shape.recompute && l > 0) {
      GptActivations::Layer layer = shared;
      layer.residual3 = source.floats(N * C);
      a.layers.push_back(layer);
      continue;
    }
    GptActivations::Layer layer{};
    layer.ln1 = source.floats(N * ln_row_elems);
    layer.ln1_mean = source.statistics(N);
    layer.ln1_rstd = source.statistics(N);
    layer.qkv = source.floats(N * 3 * C);
    layer.atty = source.floats(N * atty_row_elems);
    layer.att_probs = source.attention_state(attention);
    layer.residual2 = source.floats(N * C);
    layer.ln2 = source.floats(N * ln_row_elems);
    layer.ln2_mean = source.statistics(N);
    layer.ln2_rstd = source.statistics(N);
    layer.fch = source.floats(N * 4 * C);
    layer.fch_gelu = source.floats(N * gelu_row_elems);
    layer.residual3 = source.floats(N * C);
    a.layers.push_back(layer);
    shared = layer;
  }
  a.lnf = source.floats(N * C);
  a.lnf_mean = source.statistics(N);
  a.lnf_rstd = source.statistics(N);
  a.logits = source.logits(N, shape.model.vocab);
  a.row_stats = source.statistics(2 * N);
  a.losses = source.statistics(N);
  a.dresidual = source.floats(N * C);
  a.dln = source.floats(N * C);
  a.dqkv = source.floats(N * 3 * C);
  a.datty = source.floats(N * C);
  a.dfch = source.floats(N * 4 * C);
  a.dfch_gelu = source.floats(N * 4 * C);
}

}  // namespace scalestudy
