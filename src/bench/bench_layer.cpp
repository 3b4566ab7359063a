#include "bench/benchmarks.h"

#include <functional>
#include <vector>

#include "bench/bench_gpt.h"
#include "bench/bench_point.h"
#include "model/flops.h"
#include "model/gpt.h"

namespace scalestudy {
namespace {

using bench_model::Part;

constexpr const char* kForward = "forward";
constexpr const char* kForwardBackward = "forward+backward";
constexpr const char* kBlock = "block";
constexpr const char* kOneLayerModel = "model-1-layer";
constexpr const char* kTwoLayerModel = "model-2-layers";

void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  const std::string point = format_text("layer %s %s batch %lld seq %lld", t.text(row, "part").c_str(),
                                        t.text(row, "pass").c_str(), static_cast<long long>(t.integer(row, "batch")),
                                        static_cast<long long>(t.integer(row, "seq")));
  report_row(context, row, point,
             time_text(t, row, "median", "ms") + format_text(", %.4g TFLOP/s", t.number(row, "tflops")));
}

// What the models say of one point: its FLOPs, the bytes its ops move, and the bytes it
// allocates.
struct PointModel {
  double flops = 0.0;
  double bytes = 0.0;
  size_t memory_bytes = 0;
};

// The byte model counts fp32 elements; 16-bit activations and weights move half as many
// bytes.
size_t add_point(BenchContext& context, const std::string& part, const std::string& pass, int batch, int seq,
                 PointModel model) {
  if (is_16bit(context.config.precision)) model.bytes /= 2;
  PointTable& table = context.table;
  const size_t row = table.add_row();
  table.set(row, "part", part);
  table.set(row, "pass", pass);
  table.set(row, "batch", batch);
  table.set(row, "seq", seq);
  set_work(table, row, model.flops, model.bytes);
  table.set(row, "memory_bytes", static_cast<int64_t>(model.memory_bytes));
  return row;
}

TimedCalls measure_row(BenchContext& context, size_t row, const std::function<void()>& call) {
  const TimedCalls timed = time_flops_row(context, row, call);
  report(context, row);
  return timed;
}

bool fits(BenchContext& context, const std::vector<size_t>& rows, size_t predicted_bytes) {
  return point_fits(context, rows, predicted_bytes,
                    "predicted to need " + std::to_string(predicted_bytes) + " bytes and head-room", report);
}

// `first`, then `second`: a pass made of two, each called as directly as it was given.
template <typename First, typename Second>
auto in_turn(First first, Second second) {
  return [first, second] {
    first();
    second();
  };
}

// One model's timing calls at a point: the forward pass, and forward then backward.
struct ModelPasses {
  std::function<void()> forward;
  std::function<void()> forward_backward;
};

// The rows of one pass of the 1-layer and 2-layer models, and of the block between them.
struct PassRows {
  size_t one_layer, two_layers, block;
  size_t model_row(int layers) const { return layers == 1 ? one_layer : two_layers; }
};

// `shape` with `layers` layers.
ModelShape with_layers(ModelShape shape, int layers) {
  shape.layers = layers;
  return shape;
}

// What the models say of `shape` at one point, for the forward pass or for both passes.
PointModel model_point(const ModelShape& shape, int batch, int seq, bool backward, size_t memory_bytes) {
  double bytes = bench_model::gpt_forward_bytes(shape, batch, seq);
  if (backward) bytes += bench_model::gpt_backward_bytes(shape, batch, seq);
  const double flops = backward ? training_flops(shape, batch, seq) : forward_flops(shape, batch, seq);
  return {flops, bytes, memory_bytes};
}

// The rows of one pass: the two models, and the block as their difference.
PassRows add_pass_rows(BenchContext& context, const ModelShape& shape, int batch, int seq, bool backward,
                       size_t memory_bytes) {
  const PointModel one_model =
      model_point(with_layers(shape, 1), batch, seq, backward, memory_bytes);
  const PointModel two_model =
      model_point(with_layers(shape, 2), batch, seq, backward, memory_bytes);
  const PointModel block{two_model.flops - one_model.flops, two_model.bytes - one_model.bytes, memory_bytes};
  const char* pass = backward ? kForwardBackward : kForward;
  return {add_point(context, kOneLayerModel, pass, batch, seq, one_model),
          add_point(context, kTwoLayerModel, pass, batch, seq, two_model),
          add_point(context, kBlock, pass, batch, seq, block)};
}

// Builds a Gpt of `shape` with its parameters, gradients and a batch of random tokens,
// and hands `measure` the two passes to time; the model is freed when measure returns.
void with_model(BenchContext& context, ParameterCache& parameters, const ModelShape& shape, int batch, int seq,
                const std::function<void(const ModelPasses&)>& measure) {
  Gpt model(context.backend, shape, batch, seq, make_parameter_layout(shape).param_elems);
  parameters.initialize(context.backend, model);
  FlatGradients gradients(context.backend, model);
  const size_t tokens_count = static_cast<size_t>(batch) * static_cast<size_t>(seq);
  const std::vector<int32_t> tokens = random_tokens(tokens_count, shape.vocab, 31);
  const std::vector<int32_t> targets = random_tokens(tokens_count, shape.vocab, 32);
  const float loss_scale = 1.0f / static_cast<float>(tokens_count);
  const auto forward = [&] { model.forward(tokens.data(), targets.data(), nullptr); };
  measure({forward, in_turn(forward, [&] { model.backward(gradients, loss_scale); })});
}

// The block row's timing: sample by sample, the 2-layer model's time less the 1-layer
// model's, and the median and quartiles of those differences.
void set_block_timing(BenchContext& context, size_t row, const TimedCalls& one, const TimedCalls& two) {
  TimedCalls block;
  block.calls_per_sample = two.calls_per_sample;
  for (size_t i = 0; i < one.samples_s.size() && i < two.samples_s.size(); ++i)
    block.samples_s.push_back(two.samples_s[i] - one.samples_s[i]);
  block.stats = summarize_samples(block.samples_s);
  context.table.set_timing(row, block);
  set_flops_rate(context.table, row);
  report(context, row);
}

// The block at one batch and seq, both passes: what one more layer adds to the time of
// scalestudy::Gpt, measured as the 2-layer model less the 1-layer model, so that the
// embedding, the final LayerNorm, the head and the loss, which every model pays once,
// drop out. Both models' rows are kept. caches[i] holds the (i+1)-layer model's parameters.
void run_block(BenchContext& context, ParameterCache (&caches)[2], const ModelShape& shape, int batch, int seq) {
  const ModelShape two = with_layers(shape, 2);
  const size_t memory = bench_model::gpt_allocation_bytes(context.backend, two, batch, seq, /*backward=*/true);
  const PassRows forward = add_pass_rows(context, shape, batch, seq, false, memory);
  const PassRows both = add_pass_rows(context, shape, batch, seq, true, memory);
  const std::vector<size_t> rows{forward.one_layer, forward.two_layers, forward.block,
                                 both.one_layer,    both.two_layers,    both.block};
  if (!fits(context, rows, memory)) return;
  TimedCalls timed[2][2];  // [layers - 1][forward, forward+backward]
  for (const ModelShape& model_shape : {with_layers(shape, 1), two}) {
    const int index = model_shape.layers - 1;
    with_model(context, caches[index], model_shape, batch, seq, [&](const ModelPasses& passes) {
      timed[index][0] = measure_row(context, forward.model_row(model_shape.layers), passes.forward);
      timed[index][1] = measure_row(context, both.model_row(model_shape.layers), passes.forward_backward);
    });
  }
  set_block_timing(context, forward.block, timed[0][0], timed[1][0]);
  set_block_timing(context, both.block, timed[0][1], timed[1][1]);
}

// Every tensor of one block, shared by the parts; weights in one parameter buffer and
// their gradients in one gradient buffer, as the model keeps them.
struct BlockBuffers {
  BlockBuffers(Backend& backend, const ModelShape& shape, size_t batch, size_t seq) : backend_(backend) {
    const size_t n = batch * seq, c = static_cast<size_t>(shape.channels);
    uint64_t seed = 41;
    auto activation = [&](size_t elems) {
      float* p = allocate_random(backend_, elems, MemoryKind::activations, seed++);
      owned_.push_back(p);
      return p;
    };
    for (auto [view, elems] : {std::pair{&x, n * c}, {&fch, 4 * n * c}, {&fch_gelu, 4 * n * c}, {&out, n * c},
                               {&qkv, 3 * n * c}, {&atty, n * c}, {&dx, n * c},
                               {&dfch, 4 * n * c}, {&dfch_gelu, 4 * n * c}, {&dout, n * c}, {&dqkv, 3 * n * c},
                               {&datty, n * c}})
      *view = activation(elems);
    // The attention's state as the backend keeps it: the probabilities, or the fused
    // kernels' log-sum-exp, which the forward writes before any backward reads it.
    probs = backend_.allocate_attention_state(
        {static_cast<int>(batch), static_cast<int>(seq), shape.channels, shape.heads, shape.causal});
    owned_.push_back(probs);
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
  auto fc_forward = [&ops, &m, n, c] {
    ops.matmul_forward({.out = m.fch, .inp = m.x, .weight = m.w_fc, .bias = m.b_fc, .rows = n,
                        .in_channels = c, .out_channels = 4 * c});
  };
  auto fc_backward = [=, &m] { dense_backward(m.dx, m.dw_fc, m.db_fc, m.dfch, m.x, m.w_fc, 4 * c); };
  auto gelu_forward = [&ops, &m, nc] { ops.gelu_forward(m.fch_gelu, m.fch, 4 * nc); };
  auto gelu_backward = [&ops, &m, nc] { ops.gelu_backward(m.dfch, m.fch, m.dfch_gelu, 4 * nc, kFirst); };
  auto proj_forward = [&ops, &m, n, c] {
    ops.matmul_forward({.out = m.out, .inp = m.fch_gelu, .weight = m.w_proj, .bias = m.b_proj,
                        .rows = n, .in_channels = 4 * c, .out_channels = c});
  };
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
      forward = in_turn(fc_forward, gelu_forward);
      backward = in_turn(gelu_backward, fc_backward);
      return;
    case Part::ffn:
      forward = in_turn(fc_gelu_forward, proj_forward);
      backward = in_turn(proj_backward_through_gelu, fc_backward);
      return;
    case Part::attention:
      forward = [=, &ops, &m] {
        ops.matmul_forward({.out = m.qkv, .inp = m.x, .weight = m.w_qkv, .bias = m.b_qkv, .rows = n,
                            .in_channels = c, .out_channels = 3 * c});
        core_forward();
        ops.matmul_forward({.out = m.out, .inp = m.atty, .weight = m.w_attn, .bias = m.b_attn,
                            .rows = n, .in_channels = c, .out_channels = c});
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
  const size_t memory = parts_allocation_bytes(context.backend, shape, batch, seq);
  std::vector<std::pair<Part, std::pair<size_t, size_t>>> rows;
  for (Part part : bench_model::kParts) {
    const double flops = bench_model::part_forward_flops(part, shape, batch, seq);
    const double forward_bytes = bench_model::part_forward_bytes(part, shape, batch, seq);
    const double backward_bytes = bench_model::part_backward_bytes(part, shape, batch, seq);
    const size_t forward_row =
        add_point(context, bench_model::part_name(part), kForward, batch, seq, {flops, forward_bytes, memory});
    const size_t both_row = add_point(context, bench_model::part_name(part), kForwardBackward, batch, seq,
                                      {3 * flops, forward_bytes + backward_bytes, memory});
    rows.push_back({part, {forward_row, both_row}});
  }
  std::vector<size_t> all_rows;
  for (const auto& [part, pair] : rows) all_rows.insert(all_rows.end(), {pair.first, pair.second});
  if (!fits(context, all_rows, memory)) return;
  BlockBuffers buffers(context.backend, shape, static_cast<size_t>(batch), static_cast<size_t>(seq));
  const AttentionShape att{batch, seq, shape.channels, shape.heads, shape.causal};
  for (const auto& [part, pair] : rows) {
    std::function<void()> forward, backward;
    part_passes(context.backend, buffers, part, att, forward, backward);
    measure_row(context, pair.first, forward);
    measure_row(context, pair.second, in_turn(forward, backward));
  }
}

}  // namespace

ModelShape layer_model_shape(const ModelShape& shape) {
  ModelShape one = shape;
  one.layers = 1;
  one.vocab = kLayerVocab;
  return one;
}

size_t parts_allocation_bytes(const Backend& backend, const ModelShape& shape, int batch, int seq) {
  const size_t n = static_cast<size_t>(batch) * static_cast<size_t>(seq), c = static_cast<size_t>(shape.channels);
  const AttentionShape attention{batch, seq, shape.channels, shape.heads, shape.causal};
  const size_t activations = 2 * (14 * n * c);  // the tensors and their gradients
  const size_t weights = 12 * c * c + 9 * c;
  // The attention state, and as much again for the attention backward's scratch (the
  // probabilities' gradient, where the backend keeps probabilities).
  return backend.floats_bytes(activations, MemoryKind::activations) + 2 * backend.attention_state_bytes(attention) +
         backend.floats_bytes(weights, MemoryKind::parameters) + backend.floats_bytes(weights, MemoryKind::gradients);
}

void run_layer_bench(BenchContext& context) {
  const BenchConfig& config = context.config;
  PointTable& table = context.table;
  table.add_text("part", "block (model-2-layers less model-1-layer), model-1-layer, model-2-layers, or a part: "
                         "ffn-dense, ffn-dense-gelu, ffn, attention, attention-core");
  table.add_text("pass", "forward or forward+backward");
  table.add_int("batch", "sequences", "sequences per call");
  table.add_int("seq", "tokens", "tokens per sequence");
  add_work_columns(table, "FLOPs of one call (see the group's flop_model)",
                   "bytes one call moves by the op-level byte model (see byte_model)");
  add_memory_column(table);

  const ModelShape shape = layer_model_shape(config.shape);
  auto& m = context.method;
  describe_model_run(m, config, shape);
  m["block"] = "what one layer adds to scalestudy::Gpt (embedding, the blocks, final LayerNorm, tied LM "
               "head, softmax cross-entropy; forward+backward adds Gpt::backward into one gradient "
               "buffer): sample by sample, the model-2-layers time less the model-1-layer time";
  m["flop_model"] = "model-1-layer and model-2-layers: forward_flops (src/model/flops.h), L·(24·b·s·h² + "
                    "4·b·s²·h) + 2·b·s·h·V; block: 24·b·s·h² + 4·b·s²·h; forward+backward 3× forward. "
                    "Parts: ffn-dense and ffn-dense-gelu 8·b·s·h², ffn 16·b·s·h², attention 8·b·s·h² + "
                    "4·b·s²·h, attention-core 4·b·s²·h; backward 2× forward. Elementwise work is not "
                    "counted.";
  m["byte_model"] = "per op of src/backend/ops.h: every tensor it reads once, every tensor it writes once, "
                    "accumulated tensors read and written, in elements of the precision's activations (2 "
                    "bytes in bf16/fp16, 4 in fp32); traffic inside an op not counted "
                    "(src/bench/bench_model.h)";
  for (Part part : bench_model::kParts) m[std::string("part_") + bench_model::part_name(part)] = bench_model::part_description(part);

  ParameterCache caches[2] = {ParameterCache(1234), ParameterCache(1234)};
  for (int seq : config.seqs)
    for (int batch : config.batches) {
      run_block(context, caches, shape, batch, seq);
      run_parts(context, shape, batch, seq);
    }
}

}  // namespace scalestudy
