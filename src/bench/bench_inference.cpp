#include "bench/bench_inference.h"

#include <climits>
#include <cstdio>
#include <memory>

#include "bench/bench_gpt.h"
#include "bench/bench_model.h"
#include "model/flops.h"
#include "model/gpt.h"

namespace scalestudy {
namespace {

void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  char point[96], line[320];
  std::snprintf(point, sizeof(point), "inference batch %lld seq %lld", static_cast<long long>(t.integer(row, "batch")),
                static_cast<long long>(t.integer(row, "seq")));
  if (t.status(row) != PointStatus::ok) {
    std::snprintf(line, sizeof(line), "%s: %s (%s)", point, t.text(row, "status").c_str(),
                  t.text(row, "detail").c_str());
  } else {
    std::snprintf(line, sizeof(line), "%s: latency %.4g ms [IQR %.4g-%.4g], %.4g sequences/s, %.4g TFLOP/s", point,
                  t.number(row, "latency_ms"), t.number(row, "time_q1_s") * 1e3, t.number(row, "time_q3_s") * 1e3,
                  t.number(row, "sequences_per_s"), t.number(row, "tflops"));
  }
  context.progress(line);
}

}  // namespace

void run_inference_bench(BenchContext& context) {
  const BenchConfig& config = context.config;
  const ModelShape& shape = config.shape;
  PointTable& table = context.table;
  table.add_int("batch", "sequences", "sequences per forward");
  table.add_int("seq", "tokens", "tokens per sequence");
  table.add_float("flops", "FLOP", "forward_flops of the model (src/model/flops.h)");
  table.add_float("bytes", "bytes", "bytes one forward moves by the op-level byte model (see byte_model)");
  table.add_float("arithmetic_intensity", "FLOP/byte", "flops / bytes");
  table.add_float("latency_ms", "ms", "time_median_s in milliseconds");
  table.add_float("sequences_per_s", "sequences/s", "batch / time_median_s");
  table.add_float("tokens_per_s", "tokens/s", "batch · seq / time_median_s");
  table.add_float("tflops", "10^12 FLOP/s", "flops / time_median_s / 1e12");
  table.add_int("memory_bytes", "bytes", "bytes the point allocates, predicted before it runs");

  auto& m = context.method;
  m["timing"] = context.timer_description();
  m["model"] = config.model;
  describe_shape(m, shape);
  m["forward"] = "Gpt::forward: token upload, embedding, blocks, final LayerNorm, tied LM head, softmax "
                 "cross-entropy";
  m["flop_model"] = "forward_flops (src/model/flops.h): L·(24·b·s·h² + 4·b·s²·h) + 2·b·s·h·V";
  m["byte_model"] = "per op of src/backend/ops.h: every tensor it reads once, every tensor it writes once; fp32; "
                    "traffic inside an op not counted (src/bench/bench_model.h)";
  m["memory_model"] = "everything Gpt allocates for the micro-batch (its constructor also allocates the "
                      "backward's buffers), compared with the free memory less head-room";

  ParameterCache parameters(1234);
  for (int batch : config.batches) {
    for (int seq : config.seqs) {
      const size_t row = table.add_row();
      const double flops = forward_flops(shape, batch, seq);
      const double bytes = bench_model::gpt_forward_bytes(shape, batch, seq);
      const size_t memory = bench_model::gpt_allocation_bytes(context.backend, shape, batch, seq, /*backward=*/false);
      table.set(row, "batch", batch);
      table.set(row, "seq", seq);
      table.set(row, "flops", flops);
      table.set(row, "bytes", bytes);
      table.set(row, "arithmetic_intensity", flops / bytes);
      table.set(row, "memory_bytes", static_cast<int64_t>(memory));
      // Row counts are int in the ops; a point past them would also need far more memory
      // than any device has, so it is an OOM point, not an error.
      if (static_cast<int64_t>(batch) * seq > INT_MAX / (4 * static_cast<int64_t>(shape.channels))) {
        table.set_status(row, PointStatus::oom, "more tokens than the ops' int row counts allow");
        report(context, row);
        continue;
      }
      if (memory_with_headroom(memory) > available_memory_bytes(context.backend, config)) {
        table.set_status(row, PointStatus::oom, "predicted to need " + std::to_string(memory) + " bytes and head-room");
        report(context, row);
        continue;
      }
      Gpt model(context.backend, shape, batch, seq, make_parameter_layout(shape).param_elems);
      parameters.initialize(context.backend, model);
      const size_t tokens_count = static_cast<size_t>(batch) * static_cast<size_t>(seq);
      const std::vector<int32_t> tokens = random_tokens(tokens_count, shape.vocab, 51);
      const std::vector<int32_t> targets = random_tokens(tokens_count, shape.vocab, 52);
      std::unique_ptr<StepTimer> timer = context.backend.make_step_timer();
      const TimedCalls timed = time_calls(
          *timer, [&] { model.forward(tokens.data(), targets.data(), nullptr); }, config.warmup, config.repeats,
          config.min_sample_s, context.trace_hooks(row));
      table.set_timing(row, timed);
      const double median_s = timed.stats.median_s;
      table.set(row, "latency_ms", median_s * 1e3);
      table.set(row, "sequences_per_s", batch / median_s);
      table.set(row, "tokens_per_s", static_cast<double>(tokens_count) / median_s);
      table.set(row, "tflops", flops / median_s / 1e12);
      report(context, row);
    }
  }
}

}  // namespace scalestudy
