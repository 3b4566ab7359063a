// The benchmarks' pieces with known answers: the timing helper (warm-up excluded, median
// and IQR), nccl-tests' bus-bandwidth factors, the exact collective check, the FLOP and
// byte models, the predicted allocations against what the model really allocates, the
// size-list parser, and whole CPU benchmarks at tiny sizes (OOM and unavailable points
// kept, comm results exact).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "bench/bench_common.h"
#include "bench/bench_gpt.h"
#include "bench/bench_model.h"
#include "bench/bench_point.h"
#include "bench/benchmarks.h"
#include "comm/mpi_communicator.h"
#include "core/usage_error.h"
#include "model/flops.h"
#include "model/gpt.h"
#include "model/parameter_layout.h"

namespace scalestudy {
namespace {

// ---- timing ------------------------------------------------------------------------------

TEST(MicrobenchTiming, MedianAndQuartilesInterpolateLikeNumpy) {
  const SampleStats odd = summarize_samples({5.0, 1.0, 3.0, 2.0, 4.0});
  EXPECT_DOUBLE_EQ(odd.median_s, 3.0);
  EXPECT_DOUBLE_EQ(odd.q1_s, 2.0);
  EXPECT_DOUBLE_EQ(odd.q3_s, 4.0);
  EXPECT_DOUBLE_EQ(odd.iqr_s(), 2.0);
  // numpy.quantile([1, 2, 3, 4], [0.25, 0.5, 0.75]) = [1.75, 2.5, 3.25]
  const SampleStats even = summarize_samples({4.0, 3.0, 2.0, 1.0});
  EXPECT_DOUBLE_EQ(even.median_s, 2.5);
  EXPECT_DOUBLE_EQ(even.q1_s, 1.75);
  EXPECT_DOUBLE_EQ(even.q3_s, 3.25);
}

TEST(MicrobenchTiming, CallsPerSampleLastAtLeastTheMinimum) {
  EXPECT_EQ(calls_for(0.001, 0.01), 10);
  EXPECT_EQ(calls_for(0.003, 0.01), 4);
  EXPECT_EQ(calls_for(1.0, 0.01), 1);
  EXPECT_EQ(calls_for(0.0, 0.01), kMaxCallsPerSample);
  EXPECT_EQ(calls_for(1e-12, 1.0), kMaxCallsPerSample);
  EXPECT_EQ(calls_for(0.5, 0.0), 1);
}

// A timer on a scripted clock: each call advances it by the next scripted duration.
class ScriptedTimer final : public StepTimer {
 public:
  void start_step() override {
    origin_ = now;
    marks_.clear();
  }
  size_t mark() override {
    marks_.push_back(now - origin_);
    return marks_.size() - 1;
  }
  std::vector<double> finish_step() override { return marks_; }
  std::chrono::steady_clock::time_point host_origin() const override { return {}; }
  double now = 0.0;

 private:
  double origin_ = 0.0;
  std::vector<double> marks_;
};

TEST(MicrobenchTiming, WarmupIsExcludedAndTheLastWarmupSetsTheCallCount) {
  ScriptedTimer timer;
  // Warm-up 1 (one call) takes 1 s: one call per sample is enough. Warm-up 2 (one call)
  // takes 2 ms: 5 calls make the 9 ms asked for. Then three timed samples of 5 calls each, the
  // second of them slower.
  std::vector<double> durations = {1.0, 0.002};
  for (int sample = 0; sample < 3; ++sample)
    for (int call = 0; call < 5; ++call) durations.push_back(sample == 1 ? 0.004 : 0.002);
  size_t next = 0;
  int samples_started = 0, agreed = 0;
  TimingHooks hooks;
  hooks.before_sample = [&] { ++samples_started; };
  hooks.agree_calls = [&](int calls) {
    ++agreed;
    return calls;
  };
  const TimedCalls timed = time_calls(timer, [&] { timer.now += durations.at(next++); }, 2, 3, 0.009, hooks);
  EXPECT_EQ(next, durations.size());
  EXPECT_EQ(timed.calls_per_sample, 5);
  ASSERT_EQ(timed.samples_s.size(), 3u);
  EXPECT_NEAR(timed.samples_s[0], 0.002, 1e-12);
  EXPECT_NEAR(timed.samples_s[1], 0.004, 1e-12);
  EXPECT_NEAR(timed.stats.median_s, 0.002, 1e-12);
  EXPECT_NEAR(timed.stats.q3_s, 0.003, 1e-12);
  EXPECT_EQ(samples_started, 5);
  EXPECT_EQ(agreed, 2);
}

// ---- communication -------------------------------------------------------------------------

TEST(MicrobenchComm, BusBandwidthFactorsAreNcclTests) {
  for (int n : {1, 2, 3, 4, 8}) {
    EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveKind::allreduce, n), 2.0 * (n - 1) / n) << n;
    EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveKind::reduce_scatter, n), (n - 1.0) / n) << n;
    EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveKind::allgather, n), (n - 1.0) / n) << n;
  }
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor(CollectiveKind::allreduce, 8), 1.75);
}

TEST(MicrobenchComm, PayloadSplitsEvenlyOverTheRanks) {
  EXPECT_EQ(comm_payload_elems(1024, 1), 256u);
  EXPECT_EQ(comm_payload_elems(1024, 3), 255u);
  EXPECT_EQ(comm_payload_elems(4, 4), 4u);
  EXPECT_EQ(comm_payload_elems(int64_t{1} << 30, 8), (size_t{1} << 28));
}

TEST(MicrobenchComm, TheCheckAcceptsExactResultsAndCountsEveryWrongElement) {
  const int world = 3;
  const size_t payload = 48, per_rank = 16;
  std::vector<float> allreduce(payload), reduce_scatter(per_rank), allgather(payload);
  for (size_t i = 0; i < payload; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < world; ++r) sum += comm_input(r, i);
    allreduce[i] = sum;
    allgather[i] = comm_input(static_cast<int>(i / per_rank), i % per_rank);
  }
  const int rank = 1;
  for (size_t j = 0; j < per_rank; ++j)
    for (int r = 0; r < world; ++r) reduce_scatter[j] += comm_input(r, rank * per_rank + j);
  EXPECT_EQ(allreduce[5], 6.0f * 6.0f);  // (1 + 2 + 3) · (1 + 5 mod 251)
  EXPECT_EQ(count_wrong_elems(CollectiveKind::allreduce, rank, world, payload, allreduce), 0u);
  EXPECT_EQ(count_wrong_elems(CollectiveKind::reduce_scatter, rank, world, payload, reduce_scatter), 0u);
  EXPECT_EQ(count_wrong_elems(CollectiveKind::allgather, rank, world, payload, allgather), 0u);
  allreduce[7] += 1.0f;
  allgather[0] = allgather[16];  // rank 1's chunk where rank 0's belongs
  reduce_scatter[3] = std::nextafter(reduce_scatter[3], 0.0f);
  EXPECT_EQ(count_wrong_elems(CollectiveKind::allreduce, rank, world, payload, allreduce), 1u);
  EXPECT_EQ(count_wrong_elems(CollectiveKind::allgather, rank, world, payload, allgather), 1u);
  EXPECT_EQ(count_wrong_elems(CollectiveKind::reduce_scatter, rank, world, payload, reduce_scatter), 1u);
  // The wrong rank's expectation: rank 0's chunk is not rank 1's.
  reduce_scatter[3] = std::nextafter(reduce_scatter[3], 1e9f);
  EXPECT_EQ(count_wrong_elems(CollectiveKind::reduce_scatter, 0, world, payload, reduce_scatter), per_rank);
}

// The harness around one benchmark run in this process.
struct BenchRun {
  explicit BenchRun(BenchConfig c) : config(std::move(c)), table(config.repeats) {}
  BenchContext context(Communicator* comm = nullptr) {
    return BenchContext{config, ops, comm, MPI_COMM_WORLD, 0, 1, table, method};
  }
  BenchConfig config;
  CpuOps ops;
  PointTable table;
  std::map<std::string, std::string> method;
};

BenchConfig tiny_config(BenchKind kind) {
  BenchConfig c;
  c.kind = kind;
  c.warmup = 1;
  c.repeats = 3;
  c.min_sample_s = 0.0;
  return c;
}

// One rank is one node of one rank: the node-local and the cross-node scopes each have a
// single rank per communicator, so they are recorded as absent, with no rows.
TEST(MicrobenchComm, OneRankResultsAreExactAndItsBusBandwidthIsZero) {
  BenchConfig config = tiny_config(BenchKind::comm);
  config.collectives = kCommCollectives;
  config.min_bytes = 1024;
  config.max_bytes = 8192;
  BenchRun run(config);
  MpiCommunicator comm(MPI_COMM_WORLD, 60.0);
  BenchContext context = run.context(&comm);
  run_comm_bench(context);
  ASSERT_EQ(run.table.rows(), 3u * 4u);
  EXPECT_EQ(run.method["scope_world"], "every rank: one communicator of 1 rank(s)");
  EXPECT_EQ(run.method["scope_intra_node"], "absent: one rank per node");
  EXPECT_EQ(run.method["scope_inter_node"], "absent: one node");
  EXPECT_EQ(run.method["scopes"], "world,intra_node,inter_node");
  for (size_t row = 0; row < run.table.rows(); ++row) {
    EXPECT_EQ(run.table.text(row, "scope"), "world") << row;
    EXPECT_EQ(run.table.integer(row, "ranks"), 1) << row;
    EXPECT_EQ(run.table.status(row), PointStatus::ok) << row;
    EXPECT_EQ(run.table.integer(row, "wrong_elems"), 0) << row;
    EXPECT_GT(run.table.number(row, "algbw_gb_per_s"), 0.0) << row;
    EXPECT_EQ(run.table.number(row, "busbw_gb_per_s"), 0.0) << row;
    EXPECT_NEAR(run.table.number(row, "algbw_gb_per_s"),
                run.table.integer(row, "bytes") / run.table.number(row, "time_median_s") / 1e9, 1e-9);
  }
  EXPECT_EQ(run.table.integer(3, "bytes"), 8192);
}

// ---- FLOP and byte models ------------------------------------------------------------------

ModelShape bert_large() { return find_model_preset("bert-large").shape; }

TEST(MicrobenchModel, GemmCountsTwoFlopsPerMultiplyAdd) {
  EXPECT_DOUBLE_EQ(bench_model::gemm_flops(8192), 2.0 * 8192.0 * 8192.0 * 8192.0);
  EXPECT_DOUBLE_EQ(bench_model::gemm_bytes(1024, 2.0), 3.0 * 1024 * 1024 * 2);
  EXPECT_DOUBLE_EQ(gemm_element_bytes("bf16"), 2.0);
  EXPECT_DOUBLE_EQ(gemm_element_bytes("tf32"), 4.0);
}

TEST(MicrobenchModel, TheBlockIsTheFlopsFormulaAndItsPartsAddUp) {
  const ModelShape one = layer_model_shape(bert_large());
  EXPECT_EQ(one.layers, 1);
  EXPECT_EQ(one.vocab, kLayerVocab);
  const double b = 64, s = 128, h = 1024;
  const double block = 24 * b * s * h * h + 4 * b * s * s * h;
  EXPECT_DOUBLE_EQ(forward_flops(one, b, s), block + 2 * b * s * h * kLayerVocab);
  EXPECT_LT(2 * b * s * h * kLayerVocab / block, 0.01);  // the head is under 1 %
  using bench_model::Part;
  const double ffn = bench_model::part_forward_flops(Part::ffn, one, b, s);
  const double attention = bench_model::part_forward_flops(Part::attention, one, b, s);
  EXPECT_DOUBLE_EQ(ffn + attention, block);
  EXPECT_DOUBLE_EQ(bench_model::part_forward_flops(Part::ffn_dense, one, b, s), 8 * b * s * h * h);
  EXPECT_DOUBLE_EQ(bench_model::part_forward_flops(Part::attention_core, one, b, s), 4 * b * s * s * h);
}

TEST(MicrobenchModel, OpBytesCountEachTensorOnce) {
  // rows 2, in 3, out 4 with bias: inp 6 + weight 12 + bias 4 + out 8 elements.
  EXPECT_DOUBLE_EQ(bench_model::matmul_forward_bytes(2, 3, 4, true), 4.0 * 30);
  // dout 8 + inp 6 + weight 12, dinp 6 r+w, dweight 12 r+w, dbias 4 r+w.
  EXPECT_DOUBLE_EQ(bench_model::matmul_backward_bytes(2, 3, 4, true, true), 4.0 * (8 + 6 + 12 + 12 + 24 + 8));
  // Overwritten, dinp is only written.
  EXPECT_DOUBLE_EQ(bench_model::matmul_backward_bytes(2, 3, 4, true, false), 4.0 * (8 + 6 + 12 + 6 + 24 + 8));
  EXPECT_DOUBLE_EQ(bench_model::accumulate_bytes(10), 120.0);
  EXPECT_DOUBLE_EQ(bench_model::attention_forward_bytes(1, 2, 4, 2), 4.0 * (24 + 8 + 8));
}

TEST(MicrobenchModel, ModelBytesAreLinearInLayersAndTheBlockIsItsParts) {
  ModelShape shape = bert_large();
  const double b = 4, s = 128, n = b * s, c = shape.channels;
  auto forward_with = [&](int layers) {
    ModelShape copy = shape;
    copy.layers = layers;
    return bench_model::gpt_forward_bytes(copy, b, s);
  };
  const double block = forward_with(2) - forward_with(1);
  EXPECT_NEAR(forward_with(3) - forward_with(2), block, 1e-6 * block);
  using bench_model::Part;
  const double from_parts = bench_model::part_forward_bytes(Part::attention, shape, b, s) +
                            bench_model::part_forward_bytes(Part::ffn, shape, b, s) +
                            2 * bench_model::layernorm_forward_bytes(n, c) +
                            2 * bench_model::residual_add_bytes(n * c);
  EXPECT_NEAR(block, from_parts, 1e-9 * block);
  EXPECT_GT(bench_model::gpt_backward_bytes(shape, b, s), bench_model::gpt_forward_bytes(shape, b, s));
}

TEST(MicrobenchModel, PredictedAllocationsAreWhatTheModelAllocates) {
  for (const char* preset : {"tiny", "bert-base"}) {
    ModelShape shape = find_model_preset(preset).shape;
    shape.max_seq = 32;
    const int batch = 3, seq = 32;
    CpuOps ops;
    {
      Gpt model(ops, shape, batch, seq, make_parameter_layout(shape).param_elems);
      size_t allocated = 0;
      for (int k = 0; k < kMemoryKindCount; ++k) allocated += ops.allocated_bytes(static_cast<MemoryKind>(k));
      EXPECT_EQ(allocated, bench_model::gpt_allocation_bytes(ops, shape, batch, seq, false)) << preset;
      FlatGradients gradients(ops, model);
      // The CPU's ops hold no scratch of their own.
      EXPECT_EQ(allocated + ops.allocated_bytes(MemoryKind::gradients),
                bench_model::gpt_allocation_bytes(ops, shape, batch, seq, true))
          << preset;
    }
  }
}

// ---- parsing --------------------------------------------------------------------------------

TEST(MicrobenchOptions, SizeListsTakeSuffixesAndRanges) {
  EXPECT_EQ(parse_size_list("sizes", "128,512, 2048"), (std::vector<int64_t>{128, 512, 2048}));
  EXPECT_EQ(parse_size_list("sizes", "16K..64K"), (std::vector<int64_t>{16384, 32768, 65536}));
  EXPECT_EQ(parse_size_list("sizes", "1G"), (std::vector<int64_t>{int64_t{1} << 30}));
  EXPECT_EQ(parse_size_list("batches", "4..128").size(), 6u);
  EXPECT_EQ(parse_size_list("seqs", "64..4096").back(), 4096);
  for (const char* bad : {"0", "12X", "", "64K..16K", "1,,2", "-4", "999999999999G"}) {
    try {
      parse_size_list("sizes", bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& error) {
      EXPECT_NE(std::string(error.what()).find("--sizes"), std::string::npos) << error.what();
    }
  }
  EXPECT_THROW(parse_name_list("precisions", "fp32,fp8", {"fp32", "bf16"}), UsageError);
  EXPECT_EQ(parse_name_list("precisions", "bf16,fp32,bf16", {"fp32", "bf16"}), (std::vector<std::string>{"bf16", "fp32"}));
  EXPECT_EQ(parse_bench_kind("comm"), BenchKind::comm);
  EXPECT_THROW(parse_bench_kind("gemmm"), UsageError);
}

// ---- whole benchmarks on the cpu ---------------------------------------------------------

TEST(MicrobenchCpu, GemmMeasuresFp32AndKeepsTheOtherPrecisionsAsUnavailable) {
  BenchConfig config = tiny_config(BenchKind::gemm);
  config.gemm_sizes = {16, 32};
  config.precisions = kGemmPrecisions;
  BenchRun run(config);
  BenchContext context = run.context();
  run_gemm_bench(context);
  ASSERT_EQ(run.table.rows(), 8u);
  for (size_t row = 0; row < run.table.rows(); ++row) {
    const bool fp32 = run.table.text(row, "precision") == "fp32";
    EXPECT_EQ(run.table.status(row), fp32 ? PointStatus::ok : PointStatus::unavailable) << row;
    if (!fp32) {
      EXPECT_EQ(run.table.text(row, "detail"), "not available on cpu");
      EXPECT_TRUE(std::isnan(run.table.number(row, "tflops")));
      continue;
    }
    const double n = static_cast<double>(run.table.integer(row, "n"));
    EXPECT_DOUBLE_EQ(run.table.number(row, "flops"), 2 * n * n * n);
    EXPECT_DOUBLE_EQ(run.table.number(row, "tflops"),
                     2 * n * n * n / run.table.number(row, "time_median_s") / 1e12);
  }
}

TEST(MicrobenchCpu, LayerPointsThatDoNotFitAreMarkedOomAndKept) {
  BenchConfig config = tiny_config(BenchKind::layer);
  config.model = "tiny";
  config.shape = find_model_preset("tiny").shape;
  config.batches = {1, 2};
  config.seqs = {8};
  config.memory_limit_bytes = 1;  // below any point's head-room: every point is oom
  BenchRun oom_run(config);
  BenchContext oom_context = oom_run.context();
  run_layer_bench(oom_context);
  // At each of two points: the 1-layer model, the 2-layer model and the block, then five
  // parts, two passes each.
  const size_t rows = 2 * (2 * 3 + 2 * 5);
  ASSERT_EQ(oom_run.table.rows(), rows);
  for (size_t row = 0; row < rows; ++row) EXPECT_EQ(oom_run.table.status(row), PointStatus::oom) << row;

  config.memory_limit_bytes = 0;
  BenchRun run(config);
  BenchContext context = run.context();
  run_layer_bench(context);
  ASSERT_EQ(run.table.rows(), rows);
  for (size_t row = 0; row < rows; ++row) {
    EXPECT_EQ(run.table.status(row), PointStatus::ok) << row;
    if (run.table.text(row, "part") == "block") continue;  // a difference of two timings: any sign
    EXPECT_GT(run.table.number(row, "tflops"), 0.0) << row;
  }
  const PointTable& t = run.table;
  ASSERT_EQ(t.text(0, "part"), "model-1-layer");
  ASSERT_EQ(t.text(1, "part"), "model-2-layers");
  ASSERT_EQ(t.text(2, "part"), "block");
  ASSERT_EQ(t.text(5, "part"), "block");
  EXPECT_EQ(t.text(5, "pass"), "forward+backward");
  // The block's FLOPs are one layer's, 24·b·s·h² + 4·b·s²·h, at the first point (batch 1,
  // seq 8); sums of a few exact products, hence the tight bound.
  const double h = config.shape.channels, b = 1, s = 8;
  EXPECT_NEAR(t.number(2, "flops"), 24 * b * s * h * h + 4 * b * s * s * h, 1e-9 * t.number(2, "flops"));
  EXPECT_NEAR(t.number(5, "flops"), 3 * t.number(2, "flops"), 1e-9 * t.number(5, "flops"));
  EXPECT_DOUBLE_EQ(t.number(3, "flops"), 3 * t.number(0, "flops"));
  // The block's samples are the 2-layer model's less the 1-layer model's, sample by
  // sample, and its median is theirs: exact, since it is the same arithmetic.
  for (size_t pass : {size_t{0}, size_t{3}}) {
    std::vector<double> differences;
    for (size_t i = 0; i < t.samples_s(pass).size(); ++i)
      differences.push_back(t.samples_s(pass + 1)[i] - t.samples_s(pass)[i]);
    EXPECT_EQ(t.samples_s(pass + 2), differences) << pass;
    EXPECT_EQ(t.number(pass + 2, "time_median_s"), summarize_samples(differences).median_s) << pass;
    EXPECT_EQ(t.number(pass + 2, "tflops"), t.number(pass + 2, "flops") / summarize_samples(differences).median_s / 1e12);
  }
}

TEST(MicrobenchTable, RendersStatusAndMissingValues) {
  PointTable table(2);
  table.add_float("tflops", "10^12 FLOP/s", "rate");
  const size_t ok = table.add_row(), oom = table.add_row();
  table.set(ok, "tflops", 1.5);
  table.set_status(oom, PointStatus::oom, "too big");
  const std::string text = table.render({"status", "tflops"});
  EXPECT_NE(text.find("oom"), std::string::npos);
  EXPECT_NE(text.find("1.5"), std::string::npos);
  EXPECT_NE(text.find(" -\n"), std::string::npos);
  EXPECT_EQ(table.text(oom, "detail"), "too big");
}

TEST(MicrobenchPoint, ProgressLinesShowTheMeasurementOfPointsThatRanAndWhyTheOthersDidNot) {
  BenchRun run(tiny_config(BenchKind::gemm));
  BenchContext context = run.context();
  TimedCalls timed;
  timed.stats = {.median_s = 0.0015, .q1_s = 0.001, .q3_s = 0.002};
  const size_t ok = run.table.add_row(), wrong = run.table.add_row(), oom = run.table.add_row();
  run.table.set_timing(ok, timed);
  run.table.set_timing(wrong, timed);
  run.table.set_status(wrong, PointStatus::wrong, "3 result elements differ");
  run.table.set_status(oom, PointStatus::oom, "needs 99 bytes");
  testing::internal::CaptureStdout();
  for (size_t row : {ok, wrong, oom})
    report_row(context, row, "p" + std::to_string(row), time_text(run.table, row, "median", "ms"));
  report_row(context, ok, "q", time_text(run.table, ok, "latency", "us"));
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "  p0: median 1.5 ms [IQR 1-2]\n"
            "  p1: median 1.5 ms [IQR 1-2]\n"
            "  p2: oom (needs 99 bytes)\n"
            "  q: latency 1500 us [IQR 1000-2000]\n");
  const std::string long_text(500, 'x');
  EXPECT_EQ(format_text("%s-%d", long_text.c_str(), 7), long_text + "-7");
}

}  // namespace
}  // namespace scalestudy
