#include "model/gpt.h"

#include <cmath>
#include <vector>

#include "core/check.h"
#include "model/gpt_activations.h"
#include "model/parameter_layout.h"

namespace scalestudy {

namespace {

// The constructor's source: the backend's allocations, each remembered for release.
class AllocatingSource final : public ActivationSource {
 public:
  AllocatingSource(Backend& backend, std::vector<void*>& owned) : backend_(backend), owned_(owned) {}
  float* floats(size_t elems) override { return own(backend_.allocate_floats(elems, MemoryKind::activations)); }
  float* statistics(size_t elems) override { return own(backend_.allocate_statistics(elems)); }
  int32_t* ints(size_t elems) override { return own(backend_.allocate_ints(elems, MemoryKind::activations)); }
  float* attention_state(const AttentionShape& shape) override {
    return own(backend_.allocate_attention_state(shape));
  }
  float* logits(size_t rows, int vocab) override {
    return own(backend_.allocate_logits(static_cast<int>(rows), vocab));
  }

 private:
  template <class T>
  T* own(T* buffer) {
    owned_.push_back(buffer);
    return buffer;
  }
  Backend& backend_;
  std::vector<void*>& owned_;
};

// The preflight's source: the bytes each allocation would take, and no buffers.
class CountingSource final : public ActivationSource {
 public:
  explicit CountingSource(const Backend& backend) : backend_(backend) {}
  float* floats(size_t elems) override { return count(backend_.floats_bytes(elems, MemoryKind::activations)); }
  float* statistics(size_t elems) override { return count(DeviceMemory::statistics_bytes(elems)); }
  int32_t* ints(size_t elems) override {
    bytes_ += DeviceMemory::ints_bytes(elems);
    return nullptr;
  }
  float* attention_state(const AttentionShape& shape) override { return count(backend_.attention_state_bytes(shape)); }
  float* logits(size_t rows, int vocab) override { return count(backend_.logits_bytes(rows, vocab)); }
  size_t bytes() const { return bytes_; }

 private:
  float* count(size_t bytes) {
    bytes_ += bytes;
    return nullptr;
  }
  const Backend& backend_;
  size_t bytes_ = 0;
};

}  // namespace

Gpt::Gpt(Backend& backend, const ModelShape& shape, int micro_batch, int seq,
         size_t padded_param_elems, bool recompute)
    : ops_(backend),
      memory_(backend),
      layout_(make_parameter_layout(shape)),
      batch_(micro_batch),
      seq_(seq),
      strides_(dense_input_strides(backend, shape, micro_batch, seq)),
      padded_param_elems_(padded_param_elems),
      recompute_(recompute) {
  SCALESTUDY_CHECK(padded_param_elems_ >= layout_.param_elems, "padding shorter than the model");
  SCALESTUDY_CHECK(seq_ <= shape.max_seq && micro_batch > 0, "bad micro-batch shape");
  acts_ = new Activations();
  try {
    params_ = memory_.allocate_floats(padded_param_elems_, MemoryKind::parameters);
    memory_.fill_zero(params_, padded_param_elems_);
    AllocatingSource source(backend, owned_);
    lay_out_activations({shape, batch_, seq_, recompute_, strides_}, source, *acts_);
  } catch (...) {
    release_buffers();
    throw;
  }
}

Gpt::~Gpt() { release_buffers(); }

void Gpt::release_buffers() {
  for (void* p : owned_) memory_.release(p);
  owned_.clear();
  delete acts_;
  acts_ = nullptr;
  memory_.release(params_);
  params_ = nullptr;
}

size_t Gpt::parameter_bytes(const Backend& backend, size_t padded_param_elems) {
  return backend.floats_bytes(padded_param_elems, MemoryKind::parameters);
}

size_t Gpt::activation_bytes(const Backend& backend, const ModelShape& shape, int micro_batch, int seq,
                             bool recompute) {
  CountingSource source(backend);
  GptActivations uncounted;
  const DenseInputStrides strides = dense_input_strides(backend, shape, micro_batch, seq);
  lay_out_activations({shape, micro_batch, seq, recompute, strides}, source, uncounted);
  return source.bytes();
}

void Gpt::initialize(uint64_t seed) {
  const std::vector<float> host = initial_parameters(layout_, padded_param_elems_, seed);
  memory_.copy_from_host(params_, host.data(), padded_param_elems_);
}

void Gpt::forward(const int32_t* host_tokens, const int32_t* host_targets, ForwardHooks* hooks,
                  std::optional<float> backward_loss_scale) {
  Activations& a = *acts_;
  const ModelShape& s = layout_.shape;
  const int B = batch_, T = seq_, C = s.channels, V = s.vocab, N = B * T;
  const float* p = params_;
  memory_.copy_ints_from_host(a.tokens, host_tokens, static_cast<size_t>(N));
  memory_.copy_ints_from_host(a.targets, host_targets, static_cast<size_t>(N));

  if (hooks) hooks->before_segment_forward(layout_.embedding_segment());
  ops_.embedding_forward({.out = a.encoded,
                         .tokens = a.tokens,
                         .wte = p + layout_.wte,
                         .wpe = p + layout_.wpe,
                         .batch = B,
                         .seq = T,
                         .channels = C});

  // Each block's two projections add their result to the residual stream as they write it
  // (MatmulForwardArgs::residual), and the LayerNorm after each reads the stream alone: the
  // one that opens block l + 1, or the final one, ends block l, after its segment's hook.
  if (s.layers == 0) {
    if (hooks) hooks->before_segment_forward(layout_.final_norm_segment());
    ops_.layernorm_forward({.out = a.lnf, .mean = a.lnf_mean, .rstd = a.lnf_rstd, .inp = a.encoded,
                            .weight = p + layout_.lnf_weight, .bias = p + layout_.lnf_bias,
                            .rows = N, .channels = C});
  } else {
    if (hooks) hooks->before_segment_forward(layout_.block_segment(0));
    first_layernorm(0);
  }
  for (int l = 0; l < s.layers; ++l) {
    forward_block_body(l);
    finish_block(l, hooks);
  }

  // The LM head is tied to the token embedding: logits = lnf @ wte^T, no bias.
  ops_.classifier_forward({.losses = a.losses, .row_stats = a.row_stats, .logits = a.logits,
                           .inp = a.lnf, .weight = p + layout_.wte, .targets = a.targets, .rows = N,
                           .channels = C, .vocab = V, .dlogits_scale = backward_loss_scale});
  dlogits_scale_ = backward_loss_scale;
}

const float* Gpt::block_input(int l) const {
  return l == 0 ? acts_->encoded : acts_->layers[l - 1].residual3;
}

void Gpt::first_layernorm(int l) {
  const int N = batch_ * seq_, C = layout_.shape.channels;
  const BlockOffsets& w = layout_.blocks[l];
  Activations::Layer& x = acts_->layers[l];
  ops_.layernorm_forward({.out = x.ln1, .mean = x.ln1_mean, .rstd = x.ln1_rstd,
                          .inp = block_input(l), .weight = params_ + w.ln1_weight,
                          .bias = params_ + w.ln1_bias, .rows = N, .channels = C,
                          .out_stride = strides_.ln});
}

void Gpt::forward_block_body(int l) {
  Activations& a = *acts_;
  const ModelShape& s = layout_.shape;
  const int B = batch_, T = seq_, C = s.channels, N = B * T;
  const float* p = params_;
  const AttentionShape att{B, T, C, s.heads, s.causal, strides_.attention};
  const BlockOffsets& w = layout_.blocks[l];
  Activations::Layer& x = a.layers[l];
  ops_.matmul_forward({.out = x.qkv, .inp = x.ln1, .weight = p + w.qkv_weight,
                       .bias = p + w.qkv_bias, .rows = N, .in_channels = C, .out_channels = 3 * C,
                       .inp_stride = strides_.ln});
  ops_.attention_forward(x.atty, x.att_probs, x.qkv, att);
  ops_.matmul_forward({.out = x.residual2, .inp = x.atty, .weight = p + w.attn_proj_weight,
                       .bias = p + w.attn_proj_bias, .rows = N, .in_channels = C, .out_channels = C,
                       .inp_stride = strides_.attention, .residual = block_input(l)});
  ops_.layernorm_forward({.out = x.ln2, .mean = x.ln2_mean, .rstd = x.ln2_rstd, .inp = x.residual2,
                          .weight = p + w.ln2_weight, .bias = p + w.ln2_bias, .rows = N, .channels = C,
                          .out_stride = strides_.ln});
  ops_.dense_gelu_forward({.pre = x.fch, .out = x.fch_gelu, .inp = x.ln2, .weight = p + w.fc_weight,
                           .bias = p + w.fc_bias, .rows = N, .in_channels = C,
                           .out_channels = 4 * C, .inp_stride = strides_.ln,
                           .out_stride = strides_.gelu});
  ops_.matmul_forward({.out = x.residual3, .inp = x.fch_gelu, .weight = p + w.fc_proj_weight,
                       .bias = p + w.fc_proj_bias, .rows = N, .in_channels = 4 * C, .out_channels = C,
                       .inp_stride = strides_.gelu, .residual = x.residual2});
}

void Gpt::finish_block(int l, ForwardHooks* hooks) {
  Activations& a = *acts_;
  const int N = batch_ * seq_, C = layout_.shape.channels;
  const float* p = params_;
  Activations::Layer& x = a.layers[l];
  const bool last = l + 1 == layout_.shape.layers;
  if (hooks)
    hooks->before_segment_forward(last ? layout_.final_norm_segment() : layout_.block_segment(l + 1));
  // The LayerNorm of the block's output: the next block's first, or the final one.
  LayerNormForwardArgs<float> args{.out = a.lnf, .mean = a.lnf_mean, .rstd = a.lnf_rstd,
                                   .inp = x.residual3, .weight = p + layout_.lnf_weight,
                                   .bias = p + layout_.lnf_bias, .rows = N, .channels = C};
  if (!last) {
    Activations::Layer& next = a.layers[l + 1];
    const BlockOffsets& w = layout_.blocks[l + 1];
    args.out = next.ln1;
    args.mean = next.ln1_mean;
    args.rstd = next.ln1_rstd;
    args.weight = p + w.ln1_weight;
    args.bias = p + w.ln1_bias;
    args.out_stride = strides_.ln;
  }
  ops_.layernorm_forward(args);
}

void Gpt::recompute_block(int l) {
  first_layernorm(l);
  forward_block_body(l);
}

const float* Gpt::logits() const { return acts_->logits; }

double Gpt::mean_loss() {
  const size_t rows = static_cast<size_t>(batch_) * seq_;
  return ops_.sum(acts_->losses, rows) / static_cast<double>(rows);
}

void Gpt::backward(GradientSink& sink, float loss_scale) {
  Activations& a = *acts_;
  const ModelShape& s = layout_.shape;
  const int B = batch_, T = seq_, C = s.channels, V = s.vocab, N = B * T;
  const float* p = params_;
  const AttentionShape att{B, T, C, s.heads, s.causal, strides_.attention};

  auto grad_of = [&sink](size_t tensor_offset) { return sink.tensor_gradients(tensor_offset); };

  // Every activation gradient but the residual stream's has one writer, which
  // overwrites it: no zero fills, and no reads of stale contents.
  constexpr GradientWrite kFirst = GradientWrite::overwrite;
  if (dlogits_scale_) {
    SCALESTUDY_CHECK(*dlogits_scale_ == loss_scale,
                     "Gpt::backward: loss_scale differs from the one its forward was given");
    ops_.classifier_backward_from_dlogits({.dinp = a.dln, .dlogits = a.logits,
                                           .weight = p + layout_.wte, .rows = N, .channels = C,
                                           .vocab = V, .dinp_write = kFirst});
  } else {
    ops_.classifier_backward({.dinp = a.dln, .logits = a.logits, .row_stats = a.row_stats,
                              .weight = p + layout_.wte, .targets = a.targets, .rows = N,
                              .channels = C, .vocab = V, .loss_scale = loss_scale,
                              .dinp_write = kFirst});
  }
  // The logits now hold dlogits either way, kept for the LM head's weight gradient at the
  // end; another backward needs another forward.
  dlogits_scale_.reset();

  const int fin = layout_.final_norm_segment();
  sink.begin_segment(fin);
  const float* last = s.layers > 0 ? a.layers.back().residual3 : a.encoded;
  ops_.layernorm_backward({.dinp = a.dresidual, .dweight = grad_of(layout_.lnf_weight),
                           .dbias = grad_of(layout_.lnf_bias), .dout = a.dln, .inp = last,
                           .weight = p + layout_.lnf_weight, .mean = a.lnf_mean, .rstd = a.lnf_rstd,
                           .rows = N, .channels = C, .dinp_write = kFirst});
  sink.segment_done(fin);

  // dresidual holds d(residual3) on entry to each layer and d(its input) on exit: the
  // LayerNorm backwards accumulate the branch contributions into it.
  for (int l = s.layers - 1; l >= 0; --l) {
    const int seg = layout_.block_segment(l);
    sink.begin_segment(seg);
    const BlockOffsets& w = layout_.blocks[l];
    Activations::Layer& x = a.layers[l];
    const float* residual = block_input(l);
    // The shared buffers hold the last block's activations after forward; every other
    // block gets its own back here (rewriting residual3 with the same values).
    if (recompute_ && l != s.layers - 1) recompute_block(l);

    // dfch is written; dfch_gelu is the scratch a backend that does not fuse the GELU
    // needs for the gradient of fch_gelu.
    ops_.dense_backward_through_gelu({.dpre = a.dfch, .dweight = grad_of(w.fc_proj_weight),
                                      .dbias = grad_of(w.fc_proj_bias), .dout = a.dresidual,
                                      .act = x.fch_gelu, .pre = x.fch,
                                      .weight = p + w.fc_proj_weight, .rows = N,
                                      .in_channels = 4 * C, .out_channels = C,
                                      .dact_scratch = a.dfch_gelu, .act_stride = strides_.gelu});
    dense_backward(w.fc_weight, w.fc_bias, a.dln, a.dfch, x.ln2, strides_.ln, 4 * C, sink);
    layernorm_backward_into_residual(w.ln2_weight, w.ln2_bias, x.residual2, x.ln2_mean, x.ln2_rstd, sink);

    dense_backward(w.attn_proj_weight, w.attn_proj_bias, a.datty, a.dresidual, x.atty,
                   strides_.attention, C, sink);
    ops_.attention_backward(a.dqkv, a.datty, x.qkv, x.atty, x.att_probs, att, kFirst);
    dense_backward(w.qkv_weight, w.qkv_bias, a.dln, a.dqkv, x.ln1, strides_.ln, 3 * C, sink);
    layernorm_backward_into_residual(w.ln1_weight, w.ln1_bias, residual, x.ln1_mean, x.ln1_rstd, sink);
    sink.segment_done(seg);
  }

  sink.begin_segment(layout_.embedding_segment());
  ops_.embedding_backward({.dwte = grad_of(layout_.wte), .dwpe = grad_of(layout_.wpe),
                           .dout = a.dresidual, .tokens = a.tokens, .batch = B, .seq = T,
                           .channels = C});
  lm_head_weight_backward(sink, grad_of(layout_.wte));
}

void Gpt::dense_backward(size_t weight, size_t bias, float* dinp, const float* dout,
                         const float* inp, int inp_stride, int out_channels, GradientSink& sink) {
  ops_.matmul_backward({.dinp = dinp, .dweight = sink.tensor_gradients(weight),
                        .dbias = sink.tensor_gradients(bias), .dout = dout, .inp = inp,
                        .weight = params_ + weight, .rows = batch_ * seq_,
                        .in_channels = layout_.shape.channels, .out_channels = out_channels,
                        .dinp_write = GradientWrite::overwrite, .inp_stride = inp_stride});
}

void Gpt::layernorm_backward_into_residual(size_t weight, size_t bias, const float* inp,
                                           const float* mean, const float* rstd,
                                           GradientSink& sink) {
  ops_.layernorm_backward({.dinp = acts_->dresidual, .dweight = sink.tensor_gradients(weight),
                           .dbias = sink.tensor_gradients(bias), .dout = acts_->dln, .inp = inp,
                           .weight = params_ + weight, .mean = mean, .rstd = rstd,
                           .rows = batch_ * seq_, .channels = layout_.shape.channels,
                           .dinp_write = GradientWrite::accumulate});
}

// The LM head's weight gradient is wte's other half. Taken first, as the classifier's
// backward would, it left all of wte's gradient to wait for the embedding backward, at the
// end, and nothing hid its communication. Taken last, in parts from the last vocabulary
// rows down, each part's buckets are communicated while the next part is computed, and
// only the part with row 0 is left for the tail.
void Gpt::lm_head_weight_backward(GradientSink& sink, float* dwte) {
  const int emb = layout_.embedding_segment();
  const size_t wte_offset = layout_.wte - layout_.segments[emb].begin_elems;
  const int C = layout_.shape.channels, V = layout_.shape.vocab, N = batch_ * seq_;
  constexpr int kRowAlign = 8;  // Ops::classifier_weight_backward's vocab_begin
  const std::vector<size_t> cuts = sink.segment_cuts(emb);
  int rows_end = V;
  for (auto cut = cuts.rbegin(); cut != cuts.rend(); ++cut) {
    if (*cut <= wte_offset) break;
    // wpe, after wte, is final already.
    if (*cut >= wte_offset + static_cast<size_t>(V) * C) {
      sink.segment_done_from(emb, *cut);
      continue;
    }
    // The part starts at or below the cut, on a whole row: the bucket from the cut is final.
    const int rows_begin = static_cast<int>((*cut - wte_offset) / C / kRowAlign * kRowAlign);
    if (rows_begin == 0 || rows_begin >= rows_end) continue;
    ops_.classifier_weight_backward({.dweight = dwte, .dlogits = acts_->logits, .inp = acts_->lnf,
                                     .rows = N, .channels = C, .vocab = V,
                                     .vocab_begin = rows_begin, .vocab_end = rows_end});
    sink.segment_done_from(emb, wte_offset + static_cast<size_t>(rows_begin) * C);
    rows_end = rows_begin;
  }
  ops_.classifier_weight_backward({.dweight = dwte, .dlogits = acts_->logits, .inp = acts_->lnf,
                                   .rows = N, .channels = C, .vocab = V, .vocab_begin = 0,
                                   .vocab_end = rows_end});
  sink.segment_done(emb);
}

}  // namespace scalestudy
