#include "bench/bench_layer.h"

#include <cstdio>
#include <memory>

#include "bench/bench_gpt.h"
#include "model/flops.h"
#include "model/gpt.h"

namespace scalestudy {
namespace {

using bench_model::Part;

constexpr const char* kForward = "forward";
constexpr const char* kForwardBackward = "forward+backward";

void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  char point[160], line[320];
  std::snprintf(point, sizeof(point), "layer %s %s batch %lld seq %lld", t.text(row, "part").c_str(),
                t.text(row, "pass").c_str(), static_cast<long long>(t.integer(row, "batch")),
                static_cast<long long>(t.integer(row, "seq")));
  if (t.status(row) != PointStatus::ok) {
    std::snprintf(line, sizeof(line), "%s: %s (%s)", point, t.text(row, "status").c_str(),
                  t.text(row, "detail").c_str());
  } else {
    std::snprintf(line, sizeof(line), "%s: median %.4g ms [IQR %.4g-%.4g], %.4g TFLOP/s", point,
                  t.number(row, "time_median_s") * 1e3, t.number(row, "time_q1_s") * 1e3,
                  t.number(row, "time_q3_s") * 1e3, t.number(row, "tflops"));
  }
  context.progress(line);
}

// What the models say of one point: its FLOPs, the bytes its ops move, and the bytes it
// allocates.
struct PointModel {
  double flops = 0.0;
  double bytes = 0.0;
  size_t memory_bytes = 0;
};

size_t add_point(PointTable& table, const std::string& part, const std::string& pass, int batch, int seq,
                 const PointModel& model) {
  const size_t row = table.add_row();
  table.set(row, "part", part);
  table.set(row, "pass", pass);
  table.set(row, "batch", batch);
  table.set(row, "seq", seq);
  table.set(row, "flops", model.flops);
  table.set(row, "bytes", model.bytes);
  table.set(row, "arithmetic_intensity", model.flops / model.bytes);
  table.set(row, "memory_bytes", static_cast<int64_t>(model.memory_bytes));
  return row;
}

void time_row(BenchContext& context, size_t row, const std::function<void()>& call) {
  time_flops_row(context, row, call);
  report(context, row);
}

bool fits(BenchContext& context, size_t predicted_bytes) {
  return memory_with_headroom(predicted_bytes) <= available_memory_bytes(context.backend, context.config);
}

std::string oom_detail(size_t predicted_bytes) {
  return "predicted to need " + std::to_string(predicted_bytes) + " bytes and head-room";
}

// The whole block (as a 1-layer Gpt) at one batch and seq, both passes.
void run_block(BenchContext& context, ParameterCache& parameters, const ModelShape& shape, int batch, int seq) {
  PointTable& table = context.table;
  const double forward = forward_flops(shape, batch, seq);
  const double forward_bytes = bench_model::gpt_forward_bytes(shape, batch, seq);
  const double backward_bytes = bench_model::gpt_backward_bytes(shape, batch, seq);
  const size_t memory = bench_model::gpt_allocation_bytes(context.backend, shape, batch, seq, /*backward=*/true);
  const size_t forward_row = add_point(table, "block", kForward, batch, seq, {forward, forward_bytes, memory});
  const size_t both_row =
      add_point(table, "block", kForwardBackward, batch, seq,
                {training_flops(shape, batch, seq), forward_bytes + backward_bytes, memory});
  if (!fits(context, memory)) {
    for (size_t row : {forward_row, both_row}) {
      table.set_status(row, PointStatus::oom, oom_detail(memory));
      report(context, row);
    }
    return;
  }
  Gpt model(context.backend, shape, batch, seq, make_parameter_layout(shape).param_elems);
  parameters.initialize(context.backend, model);
  FlatGradients gradients(context.backend, model);
  const size_t tokens_count = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  const std::vector<int32_t> tokens = random_tokens(tokens_count, shape.vocab, 31);
  const std::vector<int32_t> targets = random_tokens(tokens_count, shape.vocab, 32);
  const float loss_scale = 1.0f / static_cast<float>(tokens_count);
  time_row(context, forward_row, [&] { model.forward(tokens.data(), targets.data(), nullptr); });
  time_row(context, both_row, [&] {
    model.forward(tokens.data(), targets.data(), nullptr);
    model.backward(gradients, loss_scale);
  });
}

// Every tensor of one block, shared by the parts; weights in one parameter buffer and
// their gradients in one gradient buffer, as the model keeps them.
struct BlockBuffers {
  BlockBuffers(Backend& backend, const ModelShape& shape, size_t batch, size_t seq) : backend_(backend) {
    const size_t n = batch * seq, c = static_cast<size_t>(shape.channels);
    const size_t probs_elems = batch * static_cast<size_t>(shape.heads) * seq * seq;
    uint64_t seed = 41;
    auto activation = [&](size_t elems) {
      float* p = allocate_random(backend_, elems, MemoryKind::activations, seed++);
      owned_.push_back(p);
      return p;
    };
    for (auto [view, elems] : {std::pair{&x, n * c}, {&fch, 4 * n * c}, {&fch_gelu, 4 * n * c}, {&out, n * c},
                               {&qkv, 3 * n * c}, {&atty, n * c}, {&probs, probs_elems}, {&dx, n * c},
                               {&dfch, 4 * n * c}, {&dfch_gelu, 4 * n * c}, {&dout, n * c}, {&dqkv, 3 * n * c},
                               {&datty, n * c}})
      *view = activation(elems);
    // Weight offsets: fc [4C,C], fc bias, proj [C,4C], proj bias, qkv [3C,C], qkv bias,
    // attention projection [C,C], its bias.
    const size_t sizes[] = {4 * c * c, 4 * c, 4 * c * c, c, 3 * c * c, 3 * c, c * c, c};
    size_t offsets[8], total = 0;
    for (int i = 0; i < 8; ++i) {
      offsets[i] = total;
      total += sizes[i];
    }
    weights_ = allocate_random(backend_, total, MemoryKind::parameters, seed++);
    backend_.parameters_changed(weights_, 0, total);
    grads_ = backend_.allocate_floats(total, MemoryKind::gradients);
    backend_.fill_zero(grads_, total);
    float** weight_views[] = {&w_fc, &b_fc, &w_proj, &b_proj, &w_qkv, &b_qkv, &w_attn, &b_attn};
    float** grad_views[] = {&dw_fc, &db_fc, &dw_proj, &db_proj, &dw_qkv, &db_qkv, &dw_attn, &db_attn};
    for (int i = 0; i < 8; ++i) {
      *weight_views[i] = weights_ + offsets[i];
      *grad_views[i] = grads_ + offsets[i];
    }
  }
  ~BlockBuffers() {
    for (float* p : owned_) backend_.release(p);
    backend_.release(weights_);
    backend_.release(grads_);
  }
  BlockBuffers(const BlockBuffers&) = delete;
  BlockBuffers& operator=(const BlockBuffers&) = delete;

  float *x, *fch, *fch_gelu, *out, *qkv, *atty, *probs;
  float *dx, *dfch, *dfch_gelu, *dout, *dqkv, *datty;
  float *w_fc, *b_fc, *w_proj, *b_proj, *w_qkv, *b_qkv, *w_attn, *b_attn;
  float *dw_fc, *db_fc, *dw_proj, *db_proj, *dw_qkv, *db_qkv, *dw_attn, *db_attn;

 private:
  Backend& backend_;
  std::vector<float*> owned_;
  float* weights_ = nullptr;
  float* grads_ = nullptr;
};

// The ops one part runs, forward and backward. As in the model, the input gradients
// are overwritten by their writer; the weight gradients accumulate call after call, and
// since the inputs the backward reads do not change, they only grow linearly and stay
// finite.
constexpr GradientWrite kFirst = GradientWrite::overwrite;

void part_passes(Ops& ops, BlockBuffers& m, Part part, const AttentionShape& att, std::function<void()>& forward,
                 std::function<void()>& backward) {
  const int n = att.batch * att.seq, c = att.channels;
  const size_t nc = static_cast<size_t>(n) * static_cast<size_t>(c);
  // A dense layer's backward, from [n, c] to [n, out_channels], its input gradient written.
  auto dense_backward = [&ops, n, c](float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, int out_channels) {
    ops.matmul_backward({.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = dout, .inp = inp,
                         .weight = weight, .rows = n, .in_channels = c,
                         .out_channels = out_channels, .dinp_write = kFirst});
  };
  auto fc_forward = [&ops, &m, n, c] { ops.matmul_forward(m.fch, m.x, m.w_fc, m.b_fc, n, c, 4 * c); };
  auto fc_backward = [=, &m] { dense_backward(m.dx, m.dw_fc, m.db_fc, m.dfch, m.x, m.w_fc, 4 * c); };
  auto gelu_forward = [&ops, &m, nc] { ops.gelu_forward(m.fch_gelu, m.fch, 4 * nc); };
  auto gelu_backward = [&ops, &m, nc] { ops.gelu_backward(m.dfch, m.fch, m.dfch_gelu, 4 * nc, kFirst); };
  auto proj_forward = [&ops, &m, n, c] { ops.matmul_forward(m.out, m.fch_gelu, m.w_proj, m.b_proj, n, 4 * c, c); };
  // The FFN as the model runs it: the GELU with the dense layers around it.
  auto fc_gelu_forward = [&ops, &m, n, c] {
    ops.dense_gelu_forward({.pre = m.fch, .out = m.fch_gelu, .inp = m.x, .weight = m.w_fc,
                            .bias = m.b_fc, .rows = n, .in_channels = c, .out_channels = 4 * c});
  };
  auto proj_backward_through_gelu = [&ops, &m, n, c] {
    ops.dense_backward_through_gelu({.dpre = m.dfch, .dweight = m.dw_proj, .dbias = m.db_proj,
                                     .dout = m.dout, .act = m.fch_gelu, .pre = m.fch,
                                     .weight = m.w_proj, .rows = n, .in_channels = 4 * c,
                                     .out_channels = c, .dact_scratch = m.dfch_gelu});
  };
  auto core_forward = [&ops, &m, att] { ops.attention_forward(m.atty, m.probs, m.qkv, att); };
  auto core_backward = [&ops, &m, att] {
    ops.attention_backward(m.dqkv, m.datty, m.qkv, m.atty, m.probs, att, kFirst);
  };
  switch (part) {
    case Part::ffn_dense:
      forward = fc_forward;
      backward = fc_backward;
      return;
    case Part::ffn_dense_gelu:
      forward = [=] {
        fc_forward();
        gelu_forward();
      };
      backward = [=] {
        gelu_backward();
        fc_backward();
      };
      return;
    case Part::ffn:
      forward = [=] {
        fc_gelu_forward();
        proj_forward();
      };
      backward = [=] {
        proj_backward_through_gelu();
        fc_backward();
      };
      return;
    case Part::attention:
      forward = [=, &ops, &m] {
        ops.matmul_forward(m.qkv, m.x, m.w_qkv, m.b_qkv, n, c, 3 * c);
        core_forward();
        ops.matmul_forward(m.out, m.atty, m.w_attn, m.b_attn, n, c, c);
      };
      backward = [=, &m] {
        dense_backward(m.datty, m.dw_attn, m.db_attn, m.dout, m.atty, m.w_attn, c);
        core_backward();
        dense_backward(m.dx, m.dw_qkv, m.db_qkv, m.dqkv, m.x, m.w_qkv, 3 * c);
      };
      return;
    case Part::attention_core:
      forward = core_forward;
      backward = core_backward;
      return;
  }
}

void run_parts(BenchContext& context, const ModelShape& shape, int batch, int seq) {
  PointTable& table = context.table;
  const size_t memory = parts_allocation_bytes(shape, static_cast<size_t>(batch), static_cast<size_t>(seq));
  std::vector<std::pair<Part, std::pair<size_t, size_t>>> rows;
  for (Part part : bench_model::kParts) {
    const double flops = bench_model::part_forward_flops(part, shape, batch, seq);
    const double forward_bytes = bench_model::part_forward_bytes(part, shape, batch, seq);
    const double backward_bytes = bench_model::part_backward_bytes(part, shape, batch, seq);
    const size_t forward_row =
        add_point(table, bench_model::part_name(part), kForward, batch, seq, {flops, forward_bytes, memory});
    const size_t both_row = add_point(table, bench_model::part_name(part), kForwardBackward, batch, seq,
                                      {3 * flops, forward_bytes + backward_bytes, memory});
    rows.push_back({part, {forward_row, both_row}});
  }
  if (!fits(context, memory)) {
    for (const auto& [part, pair] : rows)
      for (size_t row : {pair.first, pair.second}) {
        table.set_status(row, PointStatus::oom, oom_detail(memory));
        report(context, row);
      }
    return;
  }
  BlockBuffers buffers(context.backend, shape, static_cast<size_t>(batch), static_cast<size_t>(seq));
  const AttentionShape att{batch, seq, shape.channels, shape.heads, shape.causal};
  for (const auto& [part, pair] : rows) {
    std::function<void()> forward, backward;
    part_passes(context.backend, buffers, part, att, forward, backward);
    time_row(context, pair.first, forward);
    time_row(context, pair.second, [&] {
      forward();
      backward();
    });
  }
}

}  // namespace

ModelShape layer_model_shape(const ModelShape& shape) {
  ModelShape one = shape;
  one.layers = 1;
  one.vocab = kLayerVocab;
  return one;
}

size_t parts_allocation_bytes(const ModelShape& shape, size_t batch, size_t seq) {
  const size_t n = batch * seq, c = static_cast<size_t>(shape.channels);
  const size_t probs = batch * static_cast<size_t>(shape.heads) * seq * seq;
  const size_t activations = 2 * (14 * n * c) + probs;  // the tensors and their gradients, probs once
  const size_t weights = 12 * c * c + 9 * c;
  return (activations + 2 * weights + probs /* attention backward's scratch */) * sizeof(float);
}

void run_layer_bench(BenchContext& context) {
  const BenchConfig& config = context.config;
  PointTable& table = context.table;
  table.add_text("part", "block (the whole 1-layer model) or a part: ffn-dense, ffn-dense-gelu, ffn, attention, "
                         "attention-core");
  table.add_text("pass", "forward or forward+backward");
  table.add_int("batch", "sequences", "sequences per call");
  table.add_int("seq", "tokens", "tokens per sequence");
  table.add_float("flops", "FLOP", "FLOPs of one call (see the group's flop_model)");
  table.add_float("bytes", "bytes", "bytes one call moves by the op-level byte model (see byte_model)");
  table.add_float("arithmetic_intensity", "FLOP/byte", "flops / bytes");
  table.add_float("tflops", "10^12 FLOP/s", "flops / time_median_s / 1e12");
  table.add_int("memory_bytes", "bytes", "bytes the point allocates, predicted before it runs");

  const ModelShape shape = layer_model_shape(config.shape);
  auto& m = context.method;
  m["timing"] = context.timer_description();
  m["model"] = config.model;
  describe_shape(m, shape);
  m["block"] = "scalestudy::Gpt with one layer: embedding, the block, final LayerNorm, tied LM head, softmax "
               "cross-entropy; forward+backward adds Gpt::backward into one gradient buffer";
  m["flop_model"] = "block: forward_flops of the 1-layer model (src/model/flops.h), 24·b·s·h² + 4·b·s²·h + "
                    "2·b·s·h·V; forward+backward 3× that. Parts: ffn-dense and ffn-dense-gelu 8·b·s·h², ffn "
                    "16·b·s·h², attention 8·b·s·h² + 4·b·s²·h, attention-core 4·b·s²·h; backward 2× forward. "
                    "Elementwise work is not counted.";
  m["byte_model"] = "per op of src/backend/ops.h: every tensor it reads once, every tensor it writes once, "
                    "accumulated tensors read and written; fp32; traffic inside an op not counted "
                    "(src/bench/bench_model.h)";
  for (Part part : bench_model::kParts) m[std::string("part_") + bench_model::part_name(part)] = bench_model::part_description(part);

  ParameterCache parameters(1234);
  for (int seq : config.seqs)
    for (int batch : config.batches) run_block(context, parameters, shape, batch, seq);
  run_parts(context, shape, config.part_batch, config.part_seq);
}

}  // namespace scalestudy
