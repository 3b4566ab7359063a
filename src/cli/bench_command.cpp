// `scalestudy bench <name>`: the micro-benchmarks (src/bench/). Options are declared once
// below; --help prints those declarations, and every value is checked before anything
// runs, so bad input ends with exit code 2 and a line naming the option and the value.
#include <boost/program_options.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <optional>
#include <map>
#include <sstream>
#include <tuple>

#include "bench/bench_common.h"
#include "bench/benchmarks.h"
#include "cli/backend_setup.h"
#include "cli/commands.h"
#include "comm/mpi_runtime.h"
#include "config/command_options.h"
#include "config/option_groups.h"
#include "config/output_path.h"
#include "core/check.h"
#include "control/control_wait.h"
#include "core/usage_error.h"

namespace po = boost::program_options;

namespace scalestudy {
namespace {

// The options as typed; the lists are parsed and the backend-dependent defaults filled
// in by resolve().
struct RawOptions {
  int warmup = 2, repeats = 10;
  bool profile_kernels = false;
  double min_sample_ms = 1.0;
  std::string memory_limit = "0";
  std::string sizes, precisions;
  std::string batches, seqs;
  std::string collectives = "allreduce,reduce_scatter,allgather", min_bytes = "1K", max_bytes;
  std::string scopes = "world,intra_node,inter_node";
  // The groups that train shares (config/option_groups.h); the model's default is by backend.
  ModelShapeOptions shape;
  BackendOptions backend;
  OutputOptions output;
  CommOptions comm;
};

// The benchmarks each specific option applies to; the general options apply to all.
const std::map<std::string, std::vector<BenchKind>>& option_scope() {
  using K = BenchKind;
  static const std::map<std::string, std::vector<BenchKind>> scope = {
      {"sizes", {K::gemm, K::bandwidth}}, {"precisions", {K::gemm}},
      {"model", {K::layer, K::inference}}, {"precision", {K::layer, K::inference}},
      {"hidden", {K::layer, K::inference}}, {"attention-kernel", {K::layer, K::inference}},
      {"heads", {K::layer, K::inference}}, {"layers", {K::inference}},
      {"batches", {K::layer, K::inference}}, {"seqs", {K::layer, K::inference}},
      {"collectives", {K::comm}}, {"min-bytes", {K::comm}}, {"max-bytes", {K::comm}}, {"scopes", {K::comm}},
      {"link-emulation", {K::comm}},
  };
  return scope;
}

po::options_description bench_options(RawOptions& raw) {
  po::options_description general = help_section("General");
  add_help_option(general);
  general.add_options()
      ("memory-limit", defaulted(&raw.memory_limit),
       "bytes a point may allocate (K/M/G suffixes); 0: what the device (host) has free. Points "
       "predicted to need more are marked oom");

  po::options_description backend = help_section("Backend and precision (--precision, --attention-kernel: layer and inference)");
  add_backend_options(backend, raw.backend);

  po::options_description communication = help_section("Communication (--link-emulation: comm)");
  add_comm_options(communication, raw.comm);

  po::options_description timing = help_section("Timing");
  timing.add_options()
      ("warmup", defaulted(&raw.warmup),
       "samples run and discarded before the timed ones; at least 1 (the last sets the calls per sample)")
      ("repeats", defaulted(&raw.repeats), "timed samples per point (median and IQR)")
      ("min-sample-ms", defaulted(&raw.min_sample_ms),
       "a sample repeats the call until it lasts about this long");

  po::options_description output = help_section("Output");
  add_output_options(output, raw.output);

  po::options_description diagnostics = help_section("Diagnostics");
  add_profile_kernels_option(diagnostics, &raw.profile_kernels);

  po::options_description kernels = help_section("gemm and bandwidth");
  kernels.add_options()
      ("sizes", po::value(&raw.sizes)->default_value("", "by backend"),
       "gemm: n of the n×n×n products (cuda 128,512,2048,8192; cpu 64,128,256); bandwidth: elements per "
       "buffer (cuda 16K..64M; cpu 16K..1M). K/M/G suffixes; A..B doubles from A to B")
      ("precisions", po::value(&raw.precisions)->default_value("", "by backend"),
       "gemm precisions of fp32, tf32, fp16, bf16 (cuda all four; cpu fp32, the only one it has: any "
       "other named is kept as an unavailable point)");

  po::options_description model =
      help_section("layer and inference (default --model: cuda layer bert-large, inference bert-base; cpu tiny)");
  add_model_shape_options(model, raw.shape, "by backend");
  model.add_options()
      ("batches", po::value(&raw.batches)->default_value("", "by backend"),
       "batch sizes (layer: cuda 4..128, cpu 1,2,4; inference: cuda 1..256, cpu 1,4)")
      ("seqs", po::value(&raw.seqs)->default_value("", "by backend"),
       "sequence lengths (layer: cuda 128,512, cpu 16,32; inference: cuda 64,128,384,1024,4096, cpu 16,64); "
       "layer measures the block and each part at every batch × seq");

  po::options_description comm = help_section("comm");
  comm.add_options()
      ("collectives", defaulted(&raw.collectives),
       "collectives to measure: allreduce, reduce_scatter, allgather")
      ("min-bytes", defaulted(&raw.min_bytes), "smallest payload (doubling from it)")
      ("max-bytes", po::value(&raw.max_bytes)->default_value("", "cuda 1G, cpu 1M"), "largest payload")
      ("scopes", defaulted(&raw.scopes),
       "world, intra_node (each node's ranks, nodes at once), inter_node (one rank per node); a "
       "communicator of one rank is absent");

  po::options_description all = help_sections();
  all.add(general).add(backend).add(communication).add(timing).add(output).add(diagnostics).add(kernels).add(model)
      .add(comm);
  return all;
}

std::string bench_help() {
  RawOptions raw;
  std::ostringstream out;
  out << "Usage: scalestudy bench <gemm|bandwidth|layer|inference|comm> [options] [--output FILE.h5]\n"
         "Micro-benchmarks; each writes its points to an HDF5 file and prints a table.\n"
         "  gemm       TFLOP/s of square n×n×n products (cuBLAS on cuda; the reference matmul on the cpu)\n"
         "  bandwidth  GB/s of elementwise copy and accumulate kernels\n"
         "  layer      TFLOP/s of one transformer block, forward and forward+backward, and of its parts\n"
         "  inference  forward latency and throughput of a whole model over batch × seq\n"
         "  comm       algbw and busbw of allreduce, reduce_scatter and allgather, checked exactly, over\n"
         "             every rank, the ranks of each node and one rank per node; launch several ranks\n"
         "             with mpirun or srun (the others run on one rank)\n"
         "Timing: warm-up samples discarded, then --repeats samples; median and IQR per point.\n"
      << bench_options(raw);
  return out.str();
}

std::vector<int> int_list(const std::string& option, const std::string& text, int64_t most) {
  std::vector<int> out;
  for (int64_t value : parse_size_list(option, text)) {
    if (value > most) bad_value(option, text, std::to_string(value) + " is above " + std::to_string(most));
    out.push_back(static_cast<int>(value));
  }
  return out;
}

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// The values whose defaults stand for "by backend", which a user who gives them cannot
// mean (the model shape's and the output's are their groups').
void check_given_values(const po::variables_map& values) {
  for (const char* option : {"sizes", "batches", "seqs", "max-bytes", "model", "memory-limit"})
    if (given(values, option) && values[option].as<std::string>().empty())
      bad_value(option, "''", "is empty: give a value, or leave the option out for its default");
}

// Refuses a specific option given to a benchmark it does not apply to.
void check_scope(BenchKind kind, const po::variables_map& values) {
  for (const auto& [name, value] : values) {
    auto scope = option_scope().find(name);
    if (scope == option_scope().end() || value.defaulted()) continue;
    if (std::find(scope->second.begin(), scope->second.end(), kind) == scope->second.end())
      throw UsageError("--" + name + " does not apply to bench " + bench_kind_name(kind));
  }
}

// The options every benchmark reads: backend, output, timing, memory, kernel profile.
void resolve_general(BenchConfig& c, const RawOptions& raw, const po::variables_map& values) {
  check_backend(raw.backend.backend);
  c.backend = raw.backend.backend;
  c.output = raw.output.output;
  c.overwrite = raw.output.overwrite;
  check_given_values(values);
  check_output_options(raw.output, values, {}, /*create_folder=*/true);
  if (raw.warmup < 1) bad_value("warmup", std::to_string(raw.warmup), "must be at least 1");
  if (raw.repeats < 1) bad_value("repeats", std::to_string(raw.repeats), "must be at least 1");
  if (!(raw.min_sample_ms >= 0) || !std::isfinite(raw.min_sample_ms))
    bad_value("min-sample-ms", number_text(raw.min_sample_ms), "must be a finite number, at least 0");
  check_comm_timeout(raw.comm.comm_timeout_s);
  c.warmup = raw.warmup;
  c.repeats = raw.repeats;
  c.min_sample_s = raw.min_sample_ms / 1e3;
  c.comm_timeout_s = raw.comm.comm_timeout_s;
  c.memory_limit_bytes = raw.memory_limit == "0" ? 0 : static_cast<size_t>(parse_size("memory-limit", raw.memory_limit));
  check_profile_kernels(raw.profile_kernels, c.backend);
  c.profile_kernels = raw.profile_kernels;
}

void resolve_gemm(BenchConfig& c, const RawOptions& raw, bool cuda) {
  c.gemm_sizes = parse_size_list("sizes", raw.sizes.empty() ? (cuda ? "128,512,2048,8192" : "64,128,256") : raw.sizes);
  for (int64_t n : c.gemm_sizes)
    if (n > 65536) bad_value("sizes", raw.sizes, "n above 65536 does not fit cuBLAS's int dimensions usefully");
  c.precisions = parse_name_list("precisions", raw.precisions.empty() ? (cuda ? "fp32,tf32,fp16,bf16" : "fp32")
                                                                      : raw.precisions,
                                 {"fp32", "tf32", "fp16", "bf16"});
}

void resolve_bandwidth(BenchConfig& c, const RawOptions& raw, bool cuda) {
  c.bandwidth_elems = parse_size_list("sizes", raw.sizes.empty() ? (cuda ? "16K..64M" : "16K..1M") : raw.sizes);
  for (int64_t elems : c.bandwidth_elems)
    if (elems > (int64_t{1} << 36)) bad_value("sizes", raw.sizes, "at most 64G elements");
}

// layer and inference: the model, its precision and the batch × seq grid.
void resolve_model_bench(BenchConfig& c, const RawOptions& raw, const po::variables_map& values, bool layer) {
  const bool cuda = c.backend == "cuda";
  ModelShapeOptions shape = raw.shape;
  if (shape.model.empty()) shape.model = !cuda ? "tiny" : layer ? "bert-large" : "bert-base";
  c.model = shape.model;
  c.shape = resolve_model_shape(shape, values);
  c.precision = resolve_precision(raw.backend.precision, c.backend);
  c.attention_kernel = parse_attention_kernel(raw.backend.attention_kernel, c.backend, c.precision);
  const char* batches = layer ? (cuda ? "4..128" : "1,2,4") : (cuda ? "1..256" : "1,4");
  const char* seqs = layer ? (cuda ? "128,512" : "16,32") : (cuda ? "64,128,384,1024,4096" : "16,64");
  c.batches = int_list("batches", raw.batches.empty() ? batches : raw.batches, 1 << 20);
  c.seqs = int_list("seqs", raw.seqs.empty() ? seqs : raw.seqs, 1 << 20);
  c.shape.max_seq = *std::max_element(c.seqs.begin(), c.seqs.end());
  // Inference marks such points OOM instead (they never fit): its default grid has them.
  const int64_t most_tokens = INT_MAX / (4 * static_cast<int64_t>(c.shape.channels));
  for (int batch : layer ? c.batches : std::vector<int>{})
    for (int seq : c.seqs)
      if (static_cast<int64_t>(batch) * seq > most_tokens)
        bad_value("batches", raw.batches, "batch " + std::to_string(batch) + " × seq " + std::to_string(seq) +
                                              " is more tokens than the ops' int row counts allow");
}

void resolve_comm(BenchConfig& c, const RawOptions& raw) {
  const bool cuda = c.backend == "cuda";
  c.collectives = parse_name_list("collectives", raw.collectives, kCommCollectives);
  c.comm_scopes = parse_name_list("scopes", raw.scopes, kCommScopes);
  c.min_bytes = parse_size("min-bytes", raw.min_bytes);
  c.max_bytes = parse_size("max-bytes", raw.max_bytes.empty() ? (cuda ? "1G" : "1M") : raw.max_bytes);
  if (c.max_bytes < c.min_bytes) {
    if (raw.max_bytes.empty())
      bad_value("min-bytes", raw.min_bytes, std::string("is above the largest payload, ") + (cuda ? "1G" : "1M") +
                                                " on " + c.backend + " (raise --max-bytes)");
    bad_value("max-bytes", raw.max_bytes, "is below --min-bytes " + raw.min_bytes);
  }
  if (c.max_bytes > (int64_t{1} << 36)) bad_value("max-bytes", raw.max_bytes, "at most 64G");
  check_comm_options(raw.comm, c.backend);
  c.link_emulation = raw.comm.link_emulation;
}

BenchConfig resolve(BenchKind kind, const RawOptions& raw, const po::variables_map& values) {
  check_scope(kind, values);
  BenchConfig c;
  c.kind = kind;
  resolve_general(c, raw, values);
  const bool cuda = c.backend == "cuda";
  if (kind == BenchKind::gemm) resolve_gemm(c, raw, cuda);
  if (kind == BenchKind::bandwidth) resolve_bandwidth(c, raw, cuda);
  if (kind == BenchKind::layer || kind == BenchKind::inference) resolve_model_bench(c, raw, values, kind == BenchKind::layer);
  if (kind == BenchKind::comm) resolve_comm(c, raw);
  return c;
}

std::vector<std::string> summary_columns(BenchKind kind) {
  switch (kind) {
    case BenchKind::gemm: return {"precision", "n", "status", "time_median_s", "time_q1_s", "time_q3_s", "tflops"};
    case BenchKind::bandwidth: return {"kernel", "elems", "bytes", "status", "time_median_s", "gb_per_s"};
    case BenchKind::layer: return {"part", "pass", "batch", "seq", "status", "time_median_s", "tflops"};
    case BenchKind::inference: return {"batch", "seq", "status", "latency_ms", "sequences_per_s", "tflops"};
    case BenchKind::comm:
      return {"scope", "ranks", "collective", "bytes", "status", "time_median_s", "algbw_gb_per_s", "busbw_gb_per_s",
              "wrong_elems"};
  }
  return {};
}

void run(BenchKind kind, BenchContext& context) {
  switch (kind) {
    case BenchKind::gemm: run_gemm_bench(context); return;
    case BenchKind::bandwidth: run_bandwidth_bench(context); return;
    case BenchKind::layer: run_layer_bench(context); return;
    case BenchKind::inference: run_inference_bench(context); return;
    case BenchKind::comm: run_comm_bench(context); return;
  }
}

// The line that opens a benchmark's output, on rank 0.
void print_banner(const std::string& name, const BenchConfig& config, const RunIdentity& identity,
                  const ProcessPlacement& where) {
  const bool model_bench = config.kind == BenchKind::layer || config.kind == BenchKind::inference;
  const std::string computes =
      model_bench ? std::string(" ") + precision_name(config.precision) + ", attention " +
                        attention_kernel_used(config.attention_kernel, config.backend == "cuda", config.precision)
                  : "";
  std::printf("scalestudy bench %s: backend %s%s on %s, %d rank(s); warm-up %d, %d timed samples of >= %.3g ms\n",
              name.c_str(), config.backend.c_str(), computes.c_str(), identity.device_name.c_str(), where.world_size,
              config.warmup, config.repeats, config.min_sample_s * 1e3);
  std::fflush(stdout);
}

// How the points were measured, as the file's method attributes say.
std::map<std::string, std::string> bench_method(const BenchConfig& config) {
  std::map<std::string, std::string> method;
  method["warmup"] = std::to_string(config.warmup);
  method["repeats"] = std::to_string(config.repeats);
  method["min_sample_s"] = std::to_string(config.min_sample_s);
  method["memory_limit_bytes"] = std::to_string(config.memory_limit_bytes);
  method["statistics"] = "median and quartiles (linear interpolation, numpy's default) of the per-call time over the "
                         "timed samples; warm-up samples excluded";
  return method;
}

// The CUPTI tracer of --profile-kernels, handed to the benchmark; null without it.
std::unique_ptr<KernelTracer> attach_tracer(const BenchConfig& config, const BackendSetup& backend,
                                            BenchContext& context) {
  if (!config.profile_kernels) return nullptr;
  std::unique_ptr<KernelTracer> tracer = backend.ops->make_kernel_tracer();
  SCALESTUDY_CHECK(tracer != nullptr, "the validated --profile-kernels reached a backend without a tracer");
  if (backend.comm)
    if (void* stream = backend.comm->native_stream()) tracer->name_stream("comm", stream);
  context.tracer = tracer.get();
  context.method["kernel_trace"] = "one untimed sample per point after the timed ones, traced with CUPTI";
  return tracer;
}

// Runs the benchmark and writes its kernel trace; a failure marks the file failed.
void run_points(BenchKind kind, BenchContext& context, KernelTracer* tracer, BenchFile& file, int rank) {
  try {
    run(kind, context);
    if (tracer) {
      const std::vector<RankTrace> traces = gather_traces(MPI_COMM_WORLD, tracer->take_trace());
      if (rank == 0) file.write_kernel_trace(traces, static_cast<int64_t>(context.table.rows()) - 1);
    }
  } catch (const std::exception& error) {
    file.finish("rank " + std::to_string(rank) + ": " + error.what());
    throw;
  }
}

// Finishes the file, a point of wrong results failing it, and prints the table on rank 0;
// the exit code.
int report(BenchKind kind, const BenchConfig& config, PointTable& table, BenchFile& file, int rank) {
  std::string failure;
  for (size_t row = 0; row < table.rows(); ++row)
    if (table.status(row) == PointStatus::wrong && failure.empty())
      failure = "wrong results: " + table.text(row, "detail") + " (row " + std::to_string(row) + ")";
  failure = file.finish(failure);
  if (rank == 0) {
    std::printf("\n%s", table.render(summary_columns(kind)).c_str());
    if (!config.output.empty()) std::printf("results: %s\n", config.output.c_str());
    if (!failure.empty()) std::printf("FAILED: %s\n", failure.c_str());
  }
  return failure.empty() ? 0 : 1;
}

// The backend and communicator of a benchmark: layer and inference compute in
// --precision; the others keep BenchConfig's fp32.
BackendSetup make_bench_backend(const BenchConfig& config, const ProcessPlacement& where) {
  set_control_timeout(config.comm_timeout_s);
  std::optional<BlockingCallDeadline> startup(std::in_place, "the start-up (backend, communicator)", where.rank);
  return make_backend(config.backend_config(), where);
}

}  // namespace

int run_bench_command(int argc, const char* const* argv) {
  const ProcessPlacement where = discover_placement(MPI_COMM_WORLD);
  if (argc < 2) throw UsageError("expected a benchmark: gemm, bandwidth, layer, inference or comm (see --help)");
  const std::string name = argv[1];
  if (name == "--help" || name == "-h") {
    if (where.rank == 0) std::printf("%s", bench_help().c_str());
    return 0;
  }
  const BenchKind kind = parse_bench_kind(name);
  RawOptions raw;
  const po::options_description options = bench_options(raw);
  po::variables_map values;
  // argv[1], the benchmark's name, stands where the parser expects the program name.
  parse_options(argc - 1, argv + 1, options, values);
  if (values.count("help")) {
    if (where.rank == 0) std::printf("%s", bench_help().c_str());
    return 0;
  }
  BenchConfig config = resolve(kind, raw, values);
  if (kind != BenchKind::comm && where.world_size > 1)
    throw UsageError("bench " + name + " runs on one rank (this job has " + std::to_string(where.world_size) +
                     "); only bench comm uses several");

  config.attention_kernel = choose_attention_kernel(config.backend, config.precision, config.attention_kernel);
  BackendSetup backend = make_bench_backend(config, where);
  RunIdentity identity = backend.identity;
  identity.argv.assign(argv, argv + argc);
  identity.argv.insert(identity.argv.begin(), "scalestudy");
  if (where.rank == 0) print_banner(name, config, identity, where);

  PointTable table(config.repeats);
  std::map<std::string, std::string> method = bench_method(config);
  const std::string precision = kind == BenchKind::gemm ? join(config.precisions, ",") : precision_name(config.precision);
  BenchFile file({.output = config.output, .overwrite = config.overwrite, .inputs = {}}, kind, identity, precision,
                 MPI_COMM_WORLD);
  file.watch(&table, &method);
  BenchContext context{config, *backend.ops, backend.comm.get(), MPI_COMM_WORLD, where.rank, where.world_size,
                       table, method};
  context.make_group_comm = backend.make_group_comm;
  method["timing"] = context.timer_description();
  const std::unique_ptr<KernelTracer> tracer = attach_tracer(config, backend, context);
  run_points(kind, context, tracer.get(), file, where.rank);
  return report(kind, config, table, file, where.rank);
}

}  // namespace scalestudy
