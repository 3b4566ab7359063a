#include "bench/benchmarks.h"

#include <climits>

#include "bench/bench_gpt.h"
#include "bench/bench_model.h"
#include "bench/bench_point.h"
#include "model/flops.h"
#include "model/gpt_inference.h"

namespace scalestudy {
namespace {

void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  const std::string point = format_text("inference batch %lld seq %lld",
                                        static_cast<long long>(t.integer(row, "batch")),
                                        static_cast<long long>(t.integer(row, "seq")));
  report_row(context, row, point,
             time_text(t, row, "latency", "ms") + format_text(", %.4g sequences/s, %.4g TFLOP/s",
                                                             t.number(row, "sequences_per_s"),
                                                             t.number(row, "tflops")));
}

size_t allocated_total(const DeviceMemory& memory) {
  size_t total = 0;
  for (int kind = 0; kind < kMemoryKindCount; ++kind) total += memory.allocated_bytes(static_cast<MemoryKind>(kind));
  return total;
}

}  // namespace

void run_inference_bench(BenchContext& context) {
  const BenchConfig& config = context.config;
  const ModelShape& shape = config.shape;
  PointTable& table = context.table;
  table.add_int("batch", "sequences", "sequences per forward");
  table.add_int("seq", "tokens", "tokens per sequence");
  add_work_columns(table, "forward_flops of the model (src/model/flops.h)",
                   "bytes one forward moves by the op-level byte model (see byte_model)");
  table.add_float("latency_ms", "ms", "time_median_s in milliseconds");
  table.add_float("sequences_per_s", "sequences/s", "batch / time_median_s");
  table.add_float("tokens_per_s", "tokens/s", "batch · seq / time_median_s");
  add_memory_column(table);
  table.add_int("allocated_bytes", "bytes", "bytes the point allocated, counted by the backend");

  auto& m = context.method;
  describe_model_run(m, config, shape);
  m["forward"] = "GptInference::forward (src/model/gpt_inference.h): token upload, embedding, blocks, final "
                 "LayerNorm, tied LM head; the logits alone, no loss, no state kept for a backward";
  m["flop_model"] = "forward_flops (src/model/flops.h): L·(24·b·s·h² + 4·b·s²·h) + 2·b·s·h·V";
  m["byte_model"] = "per op of src/backend/ops.h: every tensor it reads once, every tensor it writes once, in "
                    "elements of the precision's activations (2 bytes in bf16/fp16, 4 in fp32); traffic inside "
                    "an op not counted (src/bench/bench_model.h)";
  m["memory_model"] = "inference_memory (src/model/gpt_inference.h): the parameters, one layer's working set, "
                      "one layer's attention state and the logits, as the backend stores them; compared with "
                      "the free memory less head-room";

  const double activation_bytes = is_16bit(config.precision) ? 2.0 : 4.0;
  ParameterCache parameters(1234);
  for (int batch : config.batches) {
    for (int seq : config.seqs) {
      const size_t row = table.add_row();
      const double flops = forward_flops(shape, batch, seq);
      const double bytes = bench_model::gpt_forward_bytes(shape, batch, seq) * activation_bytes / sizeof(float);
      const size_t memory = inference_memory(shape, batch, seq).bytes(context.backend);
      table.set(row, "batch", batch);
      table.set(row, "seq", seq);
      set_work(table, row, flops, bytes);
      table.set(row, "memory_bytes", static_cast<int64_t>(memory));
      // Row counts are int in the ops (element offsets are size_t in every kernel); a point
      // past them would also need far more memory than any device has, so it is an OOM
      // point, not an error.
      if (static_cast<int64_t>(batch) * seq > INT_MAX) {
        skip_point(context, {row}, PointStatus::oom, "more tokens than the ops' int row counts allow", report);
        continue;
      }
      if (!point_fits(context, {row}, memory, "predicted to need " + std::to_string(memory) + " bytes and head-room",
                      report))
        continue;
      const size_t allocated_before = allocated_total(context.backend);
      GptInference model(context.backend, shape, batch, seq);
      table.set(row, "allocated_bytes", static_cast<int64_t>(allocated_total(context.backend) - allocated_before));
      parameters.initialize(context.backend, model.params(), model.layout(), model.layout().param_elems);
      const size_t tokens_count = static_cast<size_t>(batch) * static_cast<size_t>(seq);
      const std::vector<int32_t> tokens = random_tokens(tokens_count, shape.vocab, 51);
      const TimedCalls timed = time_row(context, row, [&] { model.forward(tokens.data()); });
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
