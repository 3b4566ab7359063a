#include "model/gpt_inference.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "core/check.h"
#include "model/parameter_layout.h"

namespace scalestudy {
namespace {

// The working set inside the logits, in units of N·C activations, in the order it is laid
// out: the two residual buffers, Q/K/V and the MLP's hidden layer.
constexpr size_t kWorkingRowsOfChannels[] = {1, 1, 3, 4};
// Each buffer starts at a multiple of 128 elements, 256 bytes in 16-bit storage: the
// alignment of a buffer of its own, which the vectorised kernels rely on.
constexpr size_t kWorkingAlignElems = 128;

size_t aligned_elems(size_t elems) { return (elems + kWorkingAlignElems - 1) / kWorkingAlignElems * kWorkingAlignElems; }

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

InferenceMemory inference_memory(const ModelShape& shape, int batch, int seq) {
  const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  const size_t row_of_channels = rows * static_cast<size_t>(shape.channels);
  InferenceMemory m;
  m.parameter_elems = make_parameter_layout(shape).param_elems;
  for (size_t buffer_rows : kWorkingRowsOfChannels) m.working_elems += aligned_elems(buffer_rows * row_of_channels);
  m.layernorm_elems = row_of_channels;
  m.statistics_elems = 2 * rows;
  m.token_elems = rows;
  m.attention = {batch, seq, shape.channels, shape.heads, shape.causal};
  m.logits_rows = static_cast<int>(rows);
  m.vocab = shape.vocab;
  return m;
}

size_t InferenceMemory::logits_allocation_rows(const Backend& backend) const {
  const size_t working_bytes = backend.floats_bytes(working_elems, MemoryKind::activations);
  return std::max(static_cast<size_t>(logits_rows), ceil_div(working_bytes, backend.logits_bytes(1, vocab)));
}

size_t InferenceMemory::bytes(const Backend& backend) const {
  return backend.floats_bytes(parameter_elems, MemoryKind::parameters) +
         backend.floats_bytes(layernorm_elems, MemoryKind::activations) +
         DeviceMemory::statistics_bytes(statistics_elems) + DeviceMemory::ints_bytes(token_elems) +
         backend.attention_state_bytes(attention) + backend.logits_bytes(logits_allocation_rows(backend), vocab);
}

GptInference::GptInference(Backend& backend, const ModelShape& shape, int batch, int seq)
    : ops_(backend), memory_(backend), layout_(make_parameter_layout(shape)), batch_(batch), seq_(seq) {
  SCALESTUDY_CHECK(batch > 0 && seq > 0 && seq <= shape.max_seq, "bad inference batch shape");
  const InferenceMemory plan = inference_memory(shape, batch, seq);
  const size_t rows = plan.token_elems;
  params_ = memory_.allocate_floats(plan.parameter_elems, MemoryKind::parameters);
  tokens_ = memory_.allocate_ints(rows, MemoryKind::activations);
  logits_ = ops_.allocate_logits(static_cast<int>(plan.logits_allocation_rows(backend)), plan.vocab);
  float** working[] = {&residual_[0], &residual_[1], &qkv_, &hidden_};
  size_t offset_elems = 0;
  for (size_t i = 0; i < std::size(working); ++i) {
    *working[i] = memory_.activation_at(logits_, offset_elems);
    offset_elems += aligned_elems(kWorkingRowsOfChannels[i] * plan.layernorm_elems);
  }
  ln_ = memory_.allocate_floats(plan.layernorm_elems, MemoryKind::activations);
  mean_ = memory_.allocate_statistics(rows);
  rstd_ = memory_.allocate_statistics(rows);
  attention_state_ = ops_.allocate_attention_state(plan.attention);
}

GptInference::~GptInference() {
  for (void* buffer : std::vector<void*>{params_, tokens_, logits_, ln_, mean_, rstd_, attention_state_})
    memory_.release(buffer);
}

void GptInference::initialize(uint64_t seed) {
  const std::vector<float> host = initial_parameters(layout_, layout_.param_elems, seed);
  memory_.copy_from_host(params_, host.data(), layout_.param_elems);
  ops_.parameters_changed(params_, 0, layout_.param_elems);
}

void GptInference::forward(const int32_t* host_tokens) {
  const ModelShape& s = layout_.shape;
  const int C = s.channels, N = batch_ * seq_;
  const float* p = params_;
  memory_.copy_ints_from_host(tokens_, host_tokens, static_cast<size_t>(N));
  // The stream enters each block in residual_[0], leaves its attention half in residual_[1],
  // and its MLP half back in residual_[0], each projection adding its result to the stream as
  // it writes it, as the training forward does. ln_ holds the LayerNorm before each half, and
  // the attention's output between them.
  ops_.embedding_forward({.out = residual_[0], .tokens = tokens_, .wte = p + layout_.wte, .wpe = p + layout_.wpe,
                          .batch = batch_, .seq = seq_, .channels = C});
  const bool no_blocks = s.layers == 0;
  ops_.layernorm_forward({.out = ln_, .mean = mean_, .rstd = rstd_, .inp = residual_[0],
                          .weight = p + (no_blocks ? layout_.lnf_weight : layout_.blocks[0].ln1_weight),
                          .bias = p + (no_blocks ? layout_.lnf_bias : layout_.blocks[0].ln1_bias), .rows = N,
                          .channels = C});
  const AttentionShape attention{batch_, seq_, C, s.heads, s.causal};
  for (int l = 0; l < s.layers; ++l) {
    const BlockOffsets& w = layout_.blocks[l];
    const bool last = l + 1 == s.layers;
    ops_.matmul_forward({.out = qkv_, .inp = ln_, .weight = p + w.qkv_weight, .bias = p + w.qkv_bias,
                         .rows = N, .in_channels = C, .out_channels = 3 * C});
    ops_.attention_forward(ln_, attention_state_, qkv_, attention);
    ops_.matmul_forward({.out = residual_[1], .inp = ln_, .weight = p + w.attn_proj_weight,
                         .bias = p + w.attn_proj_bias, .rows = N, .in_channels = C, .out_channels = C,
                         .residual = residual_[0]});
    ops_.layernorm_forward({.out = ln_, .mean = mean_, .rstd = rstd_, .inp = residual_[1],
                            .weight = p + w.ln2_weight, .bias = p + w.ln2_bias, .rows = N, .channels = C});
    ops_.dense_gelu_forward({.pre = nullptr, .out = hidden_, .inp = ln_, .weight = p + w.fc_weight,
                             .bias = p + w.fc_bias, .rows = N, .in_channels = C, .out_channels = 4 * C});
    ops_.matmul_forward({.out = residual_[0], .inp = hidden_, .weight = p + w.fc_proj_weight,
                         .bias = p + w.fc_proj_bias, .rows = N, .in_channels = 4 * C, .out_channels = C,
                         .residual = residual_[1]});
    // The LayerNorm after the block: the next block's first, or the final one.
    ops_.layernorm_forward({.out = ln_, .mean = mean_, .rstd = rstd_, .inp = residual_[0],
                            .weight = p + (last ? layout_.lnf_weight : layout_.blocks[l + 1].ln1_weight),
                            .bias = p + (last ? layout_.lnf_bias : layout_.blocks[l + 1].ln1_bias), .rows = N,
                            .channels = C});
  }
  // The LM head is tied to the token embedding: logits = lnf @ wte^T.
  ops_.classifier_forward({.losses = nullptr, .row_stats = nullptr, .logits = logits_, .inp = ln_,
                           .weight = p + layout_.wte, .targets = nullptr, .rows = N, .channels = C,
                           .vocab = s.vocab, .dlogits_scale = std::nullopt});
}

}  // namespace scalestudy
