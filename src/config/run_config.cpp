#include "config/run_config.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>

#include "config/command_options.h"
#include "config/option_groups.h"
#include "config/output_path.h"
#include "core/usage_error.h"

namespace po = boost::program_options;

namespace scalestudy {
namespace {

// Text forms of the options that are not plain numbers, parsed after Boost has read them.
struct RawOptions {
  std::string scaling_unused;
  std::string strategy = "ddp";
  std::string overlap = "off";
  std::string grad_reduce = "fp32";
  std::string overlapped_ctas = "auto";
  std::string overlap_after = "auto";
  std::string gemm_algos = "timed";
  std::string loss_scaling = "auto";
  std::string attention;  // empty: the preset's
  int vocab = 0, max_seq = 0;
  // The groups that bench shares (config/option_groups.h).
  ModelShapeOptions shape;
  BackendOptions backend;
  OutputOptions output;
  CommOptions comm;
  std::string config_file;
  std::string profile_window = "auto";
  std::string gpu_telemetry_ms = "auto";
  std::string recompute = "off";
  std::string seed = "1234";
  std::string nonfinite_loss = "stop";
};

template <typename T>
std::string text(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// A float option whose default --help shows as the stream prints it (0.0006, where Boost
// would show 0.000600000028).
po::typed_value<float>* decimal(float* field) { return po::value(field)->default_value(*field, text(*field)); }

// The sections of `scalestudy train`'s options. Each entry says what the option does and,
// where Boost does not show a default, what happens without it.
po::options_description general_section(RunConfig& c, RawOptions& raw) {
  po::options_description general = help_section("General");
  add_help_option(general);
  general.add_options()
      ("config", po::value(&raw.config_file),
       "INI file of these options (name = value, without the --); the command line wins. Default: none")
      ("check", po::bool_switch(&c.check_only),
       "validate the run as on --check-ranks ranks, cross-field checks included, and exit: 0 if it "
       "would start, 2 naming what stops it; runs nothing, makes no file. Default: off")
      ("check-ranks", po::value(&c.check_ranks)->default_value(0, "unset"),
       "with --check: the number of ranks of the run checked");
  return general;
}

po::options_description model_section(RunConfig& c, RawOptions& raw) {
  po::options_description model = help_section("Model");
  add_model_shape_options(model, raw.shape, raw.shape.model);
  add_vocab_option(model, &raw.vocab);
  model.add_options()
      ("max-seq", po::value(&raw.max_seq)->default_value(0, "preset"), "rows of the position table")
      ("attention", po::value(&raw.attention)->default_value("", "preset"), "causal (GPT) or bidirectional (BERT)");
  add_seq_option(model, &c.seq);
  model.add_options()
      ("recompute", defaulted(&raw.recompute),
       "on: keep only each block's output and recompute the block in backward (activation "
       "checkpointing): far less activation memory for one more forward of the blocks");
  return model;
}

po::options_description data_section(RunConfig& c, RawOptions& raw) {
  po::options_description data = help_section("Data");
  data.add_options()
      ("data", defaulted(&c.data),
       "random (uniform tokens), markov (a synthetic source of known entropy) or file")
      ("token-file", po::value(&c.token_file),
       "token file of --data file (docs/token-file-format.md). Default: none")
      ("seed", defaulted(&raw.seed), "seed of the initialisation and of the data");
  return data;
}

po::options_description scaling_section(RunConfig& c) {
  po::options_description scaling = help_section("Batch and scaling");
  scaling.add_options()
      ("global-batch", po::value(&c.global_batch)->default_value(0, "unset"),
       "strong scaling: samples per step over all ranks, split evenly (must divide by the number of ranks)")
      ("batch-per-rank", po::value(&c.batch_per_rank)->default_value(0, "4"),
       "weak scaling: samples per step on each rank; not with --global-batch")
      ("grad-accum", defaulted(&c.grad_accum),
       "micro-batches per optimizer step; must divide the batch per rank")
      ("steps", defaulted(&c.steps), "optimizer steps")
      ("warmup-steps", po::value(&c.warmup_steps)->default_value(-1, "2"),
       "first steps, timed and recorded, that the summaries leave out; below --steps (the default 2 "
       "becomes --steps - 1 on shorter runs)");
  return scaling;
}

po::options_description optimizer_section(RunConfig& c) {
  po::options_description optimizer = help_section("Optimizer (AdamW, global-norm clipping, warm-up + cosine)");
  optimizer.add_options()
      ("lr", decimal(&c.learning_rate), "peak learning rate")
      ("min-lr-ratio", decimal(&c.min_lr_ratio), "final learning rate of the cosine decay, as a fraction of --lr")
      ("lr-warmup-steps", defaulted(&c.lr_warmup_steps),
       "steps of linear learning-rate warm-up")
      ("beta1", decimal(&c.adamw.beta1), "AdamW beta1")
      ("beta2", decimal(&c.adamw.beta2), "AdamW beta2")
      ("eps", decimal(&c.adamw.epsilon), "AdamW epsilon")
      ("weight-decay", decimal(&c.adamw.weight_decay), "decoupled weight decay, on matrices only")
      ("grad-clip", decimal(&c.grad_clip), "clip the global gradient norm to this; 0 turns clipping off");
  return optimizer;
}

po::options_description parallel_section(RunConfig& c, RawOptions& raw) {
  po::options_description parallel = help_section("Data parallelism");
  parallel.add_options()
      ("strategy", defaulted(&raw.strategy),
       "ddp (allreduce) or zero2 (reduce-scatter, optimizer state sharded over the ranks, allgather)")
      ("overlap", defaulted(&raw.overlap),
       "on: communicate each bucket while backward (and, for zero2, forward) runs")
      ("bucket-mb", defaulted(&c.bucket_mb), "gradient bucket size, MiB of fp32")
      ("grad-reduce", defaulted(&raw.grad_reduce),
       "what gradients cross ranks in: fp32, or bf16 (half the bytes; each rank's gradient and every "
       "partial sum are rounded to bf16)");
  add_comm_options(parallel, raw.comm);
  return parallel;
}

po::options_description precision_section(RunConfig& c, RawOptions& raw) {
  po::options_description precision = help_section("Backend and precision");
  add_backend_options(precision, raw.backend);
  precision.add_options()
      ("loss-scaling", defaulted(&raw.loss_scaling),
       "dynamic loss scaling: on, off, or auto (on for fp16 only); steps whose gradients overflow are skipped")
      ("loss-scale-init", decimal(&c.loss_scale_init), "initial loss scale (a power of two keeps scaling exact)")
      ("loss-scale-growth-interval",
       defaulted(&c.loss_scale_growth_interval),
       "good steps in a row before the loss scale doubles");
  return precision;
}

po::options_description output_section(RunConfig& c, RawOptions& raw) {
  po::options_description output = help_section("Output");
  add_output_options(output, raw.output);
  output.add_options()
      ("flush-every", defaulted(&c.flush_every),
       "write completed steps to the result file every N steps")
      ("log-every", defaulted(&c.log_every), "print progress every N steps")
      ("experiment", po::value(&c.experiment), "experiment name, recorded in the result file. Default: none")
      ("repeat", defaulted(&c.repeat), "repeat index, recorded in the result file");
  return output;
}

po::options_description diagnostics_section(RunConfig& c, RawOptions& raw) {
  po::options_description diagnostics = help_section("Diagnostics");
  diagnostics.add_options()
      ("nonfinite-loss", defaulted(&raw.nonfinite_loss),
       "what a step whose loss is inf or nan does: stop (the run ends, its file marked failed at that "
       "step) or continue (training goes on)")
      ("check-every", defaulted(&c.check_every),
       "compare a parameter checksum across ranks every N steps; 0: never");
  add_profile_kernels_option(diagnostics, &c.profile_kernels);
  diagnostics.add_options()
      ("profile-window", defaulted(&raw.profile_window),
       "FIRST-LAST, the steps to trace (0-based, inclusive); auto: the first three steps after warm-up")
      ("gpu-telemetry-ms", defaulted(&raw.gpu_telemetry_ms),
       "cuda: sample each GPU's SM clock, power, temperature and clock limits through NVML every N ms, "
       "into the result file's /steps/gpu_*; 0: off; at most 1000; auto: 10 on cuda, 0 on cpu");
  return diagnostics;
}

po::options_description tuning_section(RunConfig& c, RawOptions& raw) {
  po::options_description tuning = help_section("Tuning (the defaults suit most runs)");
  tuning.add_options()
      ("overlapped-ctas", defaulted(&raw.overlapped_ctas),
       "cuda: the most CTAs NCCL's kernels take for buckets that compute hides, to study how they slow the "
       "compute beside them; 0: NCCL's own choice; at most 64; auto: 4 with --overlap on, else 0")
      ("overlap-after", defaulted(&raw.overlap_after),
       "with --overlap on, how long buckets wait: the share (0 to 1) of the gradients backward finishes "
       "first; later starts cost power-capped GPUs less clock. auto: 0.5, zero2 at most 1/ranks")
      ("gemm-algos", defaulted(&raw.gemm_algos),
       "heuristic (the same bits on every run) or timed (a fewer-SM pick where clearly faster), for cuda's "
       "16-bit GEMMs with a cuBLASLt epilogue");
  add_gemm_algos_file_option(tuning, &c.gemm_algos_file);
  return tuning;
}

// The options of `scalestudy train`, by section, in the order --help prints them.
po::options_description train_options(RunConfig& c, RawOptions& raw) {
  raw.shape.model = c.model;
  raw.backend.backend = c.backend;
  raw.comm = {.comm_timeout_s = c.comm_timeout_s, .link_emulation = c.link_emulation};
  po::options_description all = help_sections();
  all.add(general_section(c, raw)).add(model_section(c, raw)).add(data_section(c, raw)).add(scaling_section(c))
      .add(optimizer_section(c)).add(parallel_section(c, raw)).add(precision_section(c, raw))
      .add(output_section(c, raw)).add(diagnostics_section(c, raw)).add(tuning_section(c, raw));
  return all;
}

int parse_whole_number(const std::string& option, const std::string& value) {
  size_t used = 0;
  int number = 0;
  try {
    number = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size()) bad_value(option, value, "must be auto or a whole number");
  return number;
}

// A number in [0, 1), written in full.
double parse_fraction(const std::string& option, const std::string& value) {
  size_t used = 0;
  double number = -1.0;
  try {
    number = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (value.empty() || used != value.size() || !(number >= 0.0 && number < 1.0))
    bad_value(option, value, "must be auto or a number from 0 up to (not including) 1");
  return number;
}

void resolve_profile_window(RunConfig& c, const std::string& window) {
  if (!c.profile_kernels) {
    if (window != "auto") bad_value("profile-window", window, "needs --profile-kernels");
    c.profile_first = c.profile_last = -1;
    return;
  }
  int first = c.warmup_steps, last = std::min(c.warmup_steps + 2, c.steps - 1);
  // A window the user wrote is checked first, as written and against the steps; an auto
  // window only after the backend, since the user chose nothing of it.
  const auto require_cuda = [&c] { check_profile_kernels(c.profile_kernels, c.backend); };
  if (window == "auto") require_cuda();
  if (window != "auto") {
    char dash = 0;
    std::istringstream in(window);
    if (!(in >> first >> dash >> last) || dash != '-' || !in.eof() || first < 0 || last < first)
      bad_value("profile-window", window, "must be FIRST-LAST with 0 <= FIRST <= LAST, e.g. 5-7");
    if (last >= c.steps) bad_value("profile-window", window, "ends beyond the last step " + std::to_string(c.steps - 1));
  }
  int untraced_measured = 0;
  for (int step = c.warmup_steps; step < c.steps; ++step)
    if (step < first || step > last) ++untraced_measured;
  if (untraced_measured == 0)
    bad_value("profile-window", window,
              "leaves no step after warm-up untraced (steps " + std::to_string(first) + "-" + std::to_string(last) +
                  " of " + std::to_string(c.steps) + "); the summary and the tracing cost need one: raise --steps");
  require_cuda();
  c.profile_first = first;
  c.profile_last = last;
}

// Whole chunks of `rows` rows, as HDF5 allocates a chunked dataset that grows.
double chunked_rows(double rows, double chunk_rows) { return std::ceil(rows / chunk_rows) * chunk_rows; }

}  // namespace

// The result file's layout (results/run_recorder.cpp): per step, 75 bytes over the ranks
// (loss, tokens, flags, step index, loss scale, bytes by collective kind) in chunks of 256
// rows, 224 bytes per rank (GPU samples, 7 phases' GPU state) in chunks of 64 rows, and the
// 7 phases' intervals, 112 bytes per rank, in chunks of 16; 60 bytes per collective record
// in chunks of 1024. A chunk's entry in its dataset's index takes under 64 bytes. The
// provenance, the config, the summary, the memory report and HDF5's own headers take under
// 256 KiB. Collective records per rank and step, as the strategies issue them: ddp one
// allreduce of all buckets, or one per bucket with --overlap on; zero2 a reduce-scatter of
// each bucket per micro-batch, an allgather of each, and the gradient norm's allreduce.
double result_file_bytes_bound(const RunConfig& c, size_t buckets) {
  const double steps = c.steps, ranks = c.world_size, bucket_count = static_cast<double>(buckets);
  const double records_per_rank_step =
      c.strategy == Strategy::zero2 ? bucket_count * (c.grad_accum + 1) + 1 : bucket_count;
  const double records = records_per_rank_step * ranks * steps;
  const double data_bytes = chunked_rows(steps, 256) * 75 + chunked_rows(steps, 64) * ranks * 224 +
                            chunked_rows(steps, 16) * ranks * 112 + chunked_rows(records, 1024) * 60;
  const double chunks = 8 * chunked_rows(steps, 256) / 256 + 10 * chunked_rows(steps, 64) / 64 +
                        chunked_rows(steps, 16) / 16 + 9 * chunked_rows(records, 1024) / 1024;
  return 256.0 * 1024 + data_bytes + 64 * chunks;
}

void check_output_space(const RunConfig& c, size_t buckets) {
  if (c.output.empty()) return;
  struct statvfs space {};
  const std::filesystem::path folder = std::filesystem::absolute(c.output).parent_path();
  if (statvfs(folder.c_str(), &space) != 0) return;
  const double free_bytes = static_cast<double>(space.f_bavail) * static_cast<double>(space.f_frsize);
  const double needed_bytes = result_file_bytes_bound(c, buckets);
  if (free_bytes < needed_bytes)
    bad_value("output", c.output,
              "its file system has " + text(std::floor(free_bytes / 1024)) + " KiB free; " + text(c.steps) +
                  " steps on " + text(c.world_size) + " ranks need up to " + text(std::ceil(needed_bytes / 1024)) +
                  " KiB");
}

namespace {

void require_positive(const std::string& option, double value) {
  if (!(value > 0) || !std::isfinite(value)) bad_value(option, text(value), "must be positive and finite");
}

// An option of two words, on and off or the like, as the bool it means.
bool parse_choice(const std::string& option, const std::string& value, const char* yes, const char* no) {
  if (value == yes) return true;
  if (value != no) bad_value(option, value, std::string("must be ") + yes + " or " + no);
  return false;
}

// The values whose defaults are sentinels, which the user may not give (--layers, --hidden
// and --heads are their group's, resolve_model_shape).
void check_given_sizes(const RunConfig& c, const po::variables_map& values) {
  // 0 is what each of these means when left out; given, it would be taken silently for that.
  const std::pair<const char*, const char*> sizes[] = {
      {"vocab", "the preset's"}, {"max-seq", "the preset's"}, {"seq", "--max-seq"}, {"batch-per-rank", "4"}};
  for (const auto& [option, otherwise] : sizes)
    if (given(values, option) && values[option].as<int>() == 0)
      bad_value(option, "0", std::string("must be at least 1 (leave it out for ") + otherwise + ")");
  if (given(values, "global-batch") && c.global_batch <= 0)
    bad_value("global-batch", text(c.global_batch), "must be at least 1 (leave it out for weak scaling)");
  if (given(values, "warmup-steps") && c.warmup_steps < 0)
    bad_value("warmup-steps", text(c.warmup_steps), "must be at least 0");
  if (given(values, "check-ranks") && !c.check_only)
    bad_value("check-ranks", text(c.check_ranks), "needs --check (a run takes its ranks from the launcher)");
  if (c.check_only && c.check_ranks < 1)
    bad_value("check-ranks", text(c.check_ranks), "--check needs the ranks of the run checked, at least 1");
}

uint64_t parse_seed(const std::string& seed) {
  size_t used = 0;
  unsigned long long parsed = 0;
  try {
    parsed = std::stoull(seed, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (seed.empty() || seed.find_first_not_of("0123456789") != std::string::npos || used != seed.size())
    bad_value("seed", seed, "must be a whole number, at least 0");
  return parsed;
}

// The given values checked on their own, before any is resolved: the sentinels, the seed,
// the experiment's name, and every floating-point option, which must be finite (inf or
// nan would train into NaN losses).
void check_given_values(RunConfig& c, const RawOptions& raw, const po::variables_map& values) {
  check_given_sizes(c, values);
  c.seed = parse_seed(raw.seed);
  // The experiment's name goes into result files and the report's tables, one line each.
  if (std::any_of(c.experiment.begin(), c.experiment.end(),
                  [](char ch) { return std::iscntrl(static_cast<unsigned char>(ch)) != 0; }))
    bad_value("experiment", "'" + c.experiment + "'", "holds a control character (a newline, a tab, an escape)");
  const std::pair<const char*, double> floats[] = {
      {"lr", c.learning_rate},          {"min-lr-ratio", c.min_lr_ratio}, {"beta1", c.adamw.beta1},
      {"beta2", c.adamw.beta2},          {"eps", c.adamw.epsilon},         {"weight-decay", c.adamw.weight_decay},
      {"grad-clip", c.grad_clip},        {"bucket-mb", c.bucket_mb},       {"comm-timeout", raw.comm.comm_timeout_s},
      {"loss-scale-init", c.loss_scale_init}};
  for (const auto& [option, value] : floats)
    if (!std::isfinite(value)) bad_value(option, text(value), "must be a finite number");
}

// ---- validation by section, in the order of --help -------------------------------------

void resolve_model(RunConfig& c, const RawOptions& raw, const po::variables_map& values) {
  c.model = raw.shape.model;
  c.shape = resolve_model_shape(raw.shape, values);
  apply_vocab(c.shape, raw.vocab);
  if (raw.max_seq < 0) bad_value("max-seq", text(raw.max_seq), "must be positive");
  if (raw.max_seq > 0) c.shape.max_seq = raw.max_seq;
  if (raw.attention == "causal") c.shape.causal = true;
  else if (raw.attention == "bidirectional") c.shape.causal = false;
  else if (!raw.attention.empty()) bad_value("attention", raw.attention, "must be causal or bidirectional");
  if (c.seq < 0) bad_value("seq", text(c.seq), "must be positive");
  if (c.seq == 0) c.seq = c.shape.max_seq;
  if (c.seq > c.shape.max_seq)
    bad_value("seq", text(c.seq), "longer than the position table (--max-seq " + text(c.shape.max_seq) + ")");
  c.recompute = parse_choice("recompute", raw.recompute, "on", "off");
}

void resolve_batch(RunConfig& c) {
  if (c.global_batch < 0) bad_value("global-batch", text(c.global_batch), "must be positive");
  if (c.batch_per_rank < 0) bad_value("batch-per-rank", text(c.batch_per_rank), "must be positive");
  if (c.global_batch > 0 && c.batch_per_rank > 0)
    bad_value("global-batch", text(c.global_batch), "cannot be combined with --batch-per-rank");
  c.scaling = c.global_batch > 0 ? Scaling::strong : Scaling::weak;
  if (c.scaling == Scaling::weak && c.batch_per_rank == 0) c.batch_per_rank = 4;
  require_positive("grad-accum", c.grad_accum);
  require_positive("steps", c.steps);
  if (c.warmup_steps == -1) c.warmup_steps = std::min(2, c.steps - 1);
  if (c.warmup_steps < 0 || c.warmup_steps >= c.steps)
    bad_value("warmup-steps", text(c.warmup_steps), "must be at least 0 and below --steps " + text(c.steps));
}

void check_optimizer(const RunConfig& c) {
  require_positive("lr", c.learning_rate);
  if (c.min_lr_ratio < 0 || c.min_lr_ratio > 1) bad_value("min-lr-ratio", text(c.min_lr_ratio), "must be in [0, 1]");
  if (c.lr_warmup_steps < 0) bad_value("lr-warmup-steps", text(c.lr_warmup_steps), "must not be negative");
  const AdamWConfig& adamw = c.adamw;
  if (adamw.beta1 < 0 || adamw.beta1 >= 1) bad_value("beta1", text(adamw.beta1), "must be in [0, 1)");
  if (adamw.beta2 < 0 || adamw.beta2 >= 1) bad_value("beta2", text(adamw.beta2), "must be in [0, 1)");
  require_positive("eps", adamw.epsilon);
  if (adamw.weight_decay < 0) bad_value("weight-decay", text(adamw.weight_decay), "must not be negative");
  if (c.grad_clip < 0) bad_value("grad-clip", text(c.grad_clip), "must not be negative");
}

void check_data(const RunConfig& c) {
  if (c.data != "random" && c.data != "markov" && c.data != "file")
    bad_value("data", c.data, "must be random, markov or file");
  if (c.data != "file") return;
  if (c.token_file.empty()) throw UsageError("--data file: needs --token-file");
  std::error_code error;
  if (!std::filesystem::exists(c.token_file, error)) bad_value("token-file", c.token_file, "no such file");
  if (std::filesystem::is_directory(c.token_file, error)) bad_value("token-file", c.token_file, "is a directory");
  if (!std::filesystem::is_regular_file(c.token_file, error))
    bad_value("token-file", c.token_file, "not a regular file (a FIFO or a device)");
  if (access(c.token_file.c_str(), R_OK) != 0) bad_value("token-file", c.token_file, "cannot be read");
}

// --overlapped-ctas as given; auto stays 0 until the backend is known (resolve_backend).
void resolve_overlapped_ctas(RunConfig& c, const std::string& ctas) {
  if (ctas == "auto") return;
  c.overlapped_ctas = parse_whole_number("overlapped-ctas", ctas);
  if (c.overlapped_ctas < 0) bad_value("overlapped-ctas", ctas, "must not be negative");
  // A lane of more CTAs than NCCL's own choice (tens of CTAs) takes more of the GPU, not less.
  if (c.overlapped_ctas > kMaxOverlappedCtas)
    bad_value("overlapped-ctas", ctas, "must be at most " + std::to_string(kMaxOverlappedCtas));
  if (c.overlapped_ctas > 0 && !c.overlap)
    bad_value("overlapped-ctas", ctas, "needs --overlap on (without it compute waits for every collective)");
}

void resolve_overlap_after(RunConfig& c, const std::string& after) {
  if (after == "auto") {
    // zero2's share also depends on the world size: resolve_for_world bounds it.
    c.overlap_after = c.overlap ? kAutoOverlapAfter : 0.0;
    c.overlap_after_auto = true;
    return;
  }
  c.overlap_after = parse_fraction("overlap-after", after);
  if (c.overlap_after > 0 && !c.overlap)
    bad_value("overlap-after", after, "needs --overlap on (without it one collective follows backward)");
}

void resolve_parallelism(RunConfig& c, const RawOptions& raw) {
  if (raw.strategy == "ddp") c.strategy = Strategy::ddp;
  else if (raw.strategy == "zero2") c.strategy = Strategy::zero2;
  else bad_value("strategy", raw.strategy, "must be ddp or zero2");
  c.overlap = parse_choice("overlap", raw.overlap, "on", "off");
  require_positive("bucket-mb", c.bucket_mb);
  if (raw.grad_reduce == "fp32") c.grad_reduce = Precision::fp32;
  else if (raw.grad_reduce == "bf16") c.grad_reduce = Precision::bf16;
  else bad_value("grad-reduce", raw.grad_reduce, "must be fp32 or bf16");
  resolve_overlapped_ctas(c, raw.overlapped_ctas);
  resolve_overlap_after(c, raw.overlap_after);
  if (c.check_every < 0) bad_value("check-every", text(c.check_every), "must not be negative");
  c.stop_on_nonfinite_loss = parse_choice("nonfinite-loss", raw.nonfinite_loss, "stop", "continue");
  c.comm_timeout_s = raw.comm.comm_timeout_s;
  c.link_emulation = raw.comm.link_emulation;
}

void resolve_gemm_algos(RunConfig& c, const RawOptions& raw) {
  if (raw.gemm_algos == "timed") c.gemm_algos = GemmAlgos::timed;
  else if (raw.gemm_algos == "heuristic") c.gemm_algos = GemmAlgos::heuristic;
  else if (raw.gemm_algos == "sustained")
    bad_value("gemm-algos", raw.gemm_algos,
              "is not a run's choice: scalestudy gemm-search times the step's GEMMs under sustained load and "
              "writes a file for --gemm-algos-file (docs/strategies.md)");
  else bad_value("gemm-algos", raw.gemm_algos, "must be timed or heuristic");
  if (!c.gemm_algos_file.empty() && !std::ifstream(c.gemm_algos_file))
    bad_value("gemm-algos-file", c.gemm_algos_file, "cannot be read");
}

void resolve_loss_scaling(RunConfig& c, const std::string& loss_scaling) {
  if (loss_scaling == "auto") c.loss_scaling = c.precision == Precision::fp16;
  else if (loss_scaling == "on") c.loss_scaling = true;
  else if (loss_scaling == "off") c.loss_scaling = false;
  else bad_value("loss-scaling", loss_scaling, "must be on, off or auto");
  require_positive("loss-scale-init", c.loss_scale_init);
  require_positive("loss-scale-growth-interval", c.loss_scale_growth_interval);
}

void resolve_backend(RunConfig& c, const RawOptions& raw) {
  c.backend = raw.backend.backend;
  check_backend(c.backend);
  c.precision = resolve_precision(raw.backend.precision, c.backend);
  check_comm_options(raw.comm, c.backend);
  resolve_gemm_algos(c, raw);
  c.attention_kernel = parse_attention_kernel(raw.backend.attention_kernel, c.backend, c.precision);
  resolve_loss_scaling(c, raw.loss_scaling);
  if (c.backend == "cpu" && c.overlapped_ctas > 0)
    bad_value("overlapped-ctas", raw.overlapped_ctas, "needs --backend cuda (the cpu backend communicates through MPI)");
  if (c.backend == "cuda" && raw.overlapped_ctas == "auto" && c.overlap) c.overlapped_ctas = kAutoOverlappedCtas;
}

void resolve_gpu_telemetry(RunConfig& c, const std::string& telemetry) {
  if (telemetry == "auto") {
    c.gpu_telemetry_ms = c.backend == "cuda" ? kAutoGpuTelemetryMs : 0;
    return;
  }
  c.gpu_telemetry_ms = parse_whole_number("gpu-telemetry-ms", telemetry);
  if (c.gpu_telemetry_ms < 0 || c.gpu_telemetry_ms > kMaxGpuTelemetryMs)
    bad_value("gpu-telemetry-ms", telemetry, "must be 0 (off) to " + std::to_string(kMaxGpuTelemetryMs) + " ms");
  if (c.gpu_telemetry_ms > 0 && c.backend != "cuda")
    bad_value("gpu-telemetry-ms", telemetry, "needs --backend cuda (the " + c.backend + " backend has no GPU to sample)");
}

void resolve_output(RunConfig& c, const RawOptions& raw, const po::variables_map& values) {
  c.output = raw.output.output;
  c.overwrite = raw.output.overwrite;
  check_output_options(raw.output, values, {{"token-file", c.token_file}, {"config", raw.config_file}},
                       /*create_folder=*/!c.check_only);
  require_positive("flush-every", c.flush_every);
  require_positive("log-every", c.log_every);
  if (c.repeat < 0) bad_value("repeat", text(c.repeat), "must not be negative");
}

void resolve_and_validate(RunConfig& c, const RawOptions& raw, const po::variables_map& values) {
  resolve_model(c, raw, values);
  resolve_batch(c);
  check_optimizer(c);
  check_data(c);
  resolve_parallelism(c, raw);
  resolve_backend(c, raw);
  resolve_gpu_telemetry(c, raw.gpu_telemetry_ms);
  resolve_output(c, raw, values);
  resolve_profile_window(c, raw.profile_window);
}

}  // namespace

const char* scaling_name(Scaling s) { return s == Scaling::strong ? "strong" : "weak"; }

DataParallelConfig RunConfig::data_parallel() const {
  DataParallelConfig parallel;
  parallel.strategy = strategy;
  parallel.overlap = overlap;
  parallel.overlap_after = overlap_after;
  // A power of two: the bytes are exact for any --bucket-mb.
  parallel.bucket_bytes = bucket_mb * 1024.0 * 1024.0;
  parallel.grad_reduce = grad_reduce;
  parallel.grad_clip = grad_clip;
  parallel.adamw = adamw;
  return parallel;
}

BackendConfig RunConfig::backend_config() const {
  return {.backend = backend,
          .precision = precision,
          .attention_kernel = attention_kernel,
          .gemm_algos = gemm_algos,
          .gemm_algos_file = gemm_algos_file,
          .comm_timeout_s = comm_timeout_s,
          .link_emulation = link_emulation,
          .overlapped_ctas = overlapped_ctas,
          .gpu_telemetry_ms = gpu_telemetry_ms};
}

bool parse_train_config(int argc, const char* const* argv, RunConfig& config) {
  RawOptions raw;
  po::options_description options = train_options(config, raw);
  po::variables_map values;
  const ConfigLines config_lines = parse_options(argc, argv, options, values);
  if (values.count("help")) return false;
  naming_config_lines(config_lines, [&] {
    check_given_values(config, raw, values);
    resolve_and_validate(config, raw, values);
  });
  return true;
}

std::string train_help() {
  RunConfig defaults;
  RawOptions raw;
  std::ostringstream out;
  out << "Usage: scalestudy train [options]\n"
         "Trains a GPT-style transformer data-parallel over the MPI ranks and times every phase.\n"
         "Launch several ranks with mpirun or srun; one rank needs no launcher.\n"
      << train_options(defaults, raw);
  return out.str();
}

void resolve_for_world(RunConfig& c, int world_size) {
  c.world_size = world_size;
  // zero2 stages the held buckets' gradients unsharded: at most one shard's worth of them,
  // so that its gradient memory still shrinks with the world.
  if (c.overlap_after_auto && c.strategy == Strategy::zero2)
    c.overlap_after = std::min(c.overlap_after, 1.0 / static_cast<double>(world_size));
  if (c.scaling == Scaling::strong) {
    if (c.global_batch % world_size != 0)
      bad_value("global-batch", text(c.global_batch),
                "does not divide evenly over " + text(world_size) + " ranks");
    c.batch_per_rank = c.global_batch / world_size;
  } else {
    c.global_batch = c.batch_per_rank * world_size;
  }
  if (c.batch_per_rank % c.grad_accum != 0)
    bad_value("grad-accum", text(c.grad_accum),
              "must divide the batch per rank (" + text(c.batch_per_rank) + ")");
}

std::vector<std::pair<std::string, std::string>> describe_config(const RunConfig& c) {
  std::vector<std::pair<std::string, std::string>> out = {
      {"model", c.model},
      {"layers", text(c.shape.layers)},
      {"hidden", text(c.shape.channels)},
      {"heads", text(c.shape.heads)},
      {"vocab", text(c.shape.vocab)},
      {"max_seq", text(c.shape.max_seq)},
      {"attention", c.shape.causal ? "causal" : "bidirectional"},
      {"seq", text(c.seq)},
      {"recompute", c.recompute ? "on" : "off"},
      {"scaling", scaling_name(c.scaling)},
      {"global_batch", text(c.global_batch)},
      {"batch_per_rank", text(c.batch_per_rank)},
      {"grad_accum", text(c.grad_accum)},
      {"steps", text(c.steps)},
      {"warmup_steps", text(c.warmup_steps)},
      {"lr", text(c.learning_rate)},
      {"min_lr_ratio", text(c.min_lr_ratio)},
      {"lr_warmup_steps", text(c.lr_warmup_steps)},
      {"beta1", text(c.adamw.beta1)},
      {"beta2", text(c.adamw.beta2)},
      {"eps", text(c.adamw.epsilon)},
      {"weight_decay", text(c.adamw.weight_decay)},
      {"grad_clip", text(c.grad_clip)},
      {"loss_scaling", c.loss_scaling ? "on" : "off"},
      {"loss_scale_init", text(c.loss_scale_init)},
      {"loss_scale_growth_interval", text(c.loss_scale_growth_interval)},
      {"data", c.data},
      {"token_file", c.token_file},
      {"seed", text(c.seed)},
      {"strategy", strategy_name(c.strategy)},
      {"overlap", c.overlap ? "on" : "off"},
      {"bucket_mb", text(c.bucket_mb)},
      {"grad_reduce", precision_name(c.grad_reduce)},
      {"overlapped_ctas", text(c.overlapped_ctas)},
      // What the user asked for, which one series shares, and what it resolved to on this
      // world size (auto bounds zero2's share by 1/N, so that differs along a series).
      {"overlap_after", c.overlap_after_auto ? "auto" : text(c.overlap_after)},
      {"overlap_after_resolved", text(c.overlap_after)},
      {"check_every", text(c.check_every)},
      {"comm_timeout", text(c.comm_timeout_s)},
      {"link_emulation", c.link_emulation},
      {"backend", c.backend},
      {"precision", precision_name(c.precision)},
      {"gemm_algos", gemm_algos_name(c.gemm_algos)},
      {"gemm_algos_file", c.gemm_algos_file},
      {"attention_kernel", attention_kernel_used(c.attention_kernel, c.backend == "cuda", c.precision)},
      {"output", c.output},
      {"flush_every", text(c.flush_every)},
      {"experiment", c.experiment},
      {"repeat", text(c.repeat)},
      {"profile_kernels", c.profile_kernels ? "on" : "off"},
      {"profile_window", c.profile_kernels ? text(c.profile_first) + "-" + text(c.profile_last) : ""},
      {"gpu_telemetry_ms", text(c.gpu_telemetry_ms)},
      {"world_size", text(c.world_size)},
  };
  return out;
}

uint64_t config_hash(const RunConfig& config) {
  // FNV-1a over "name=value;" pairs: stable across processes and builds.
  uint64_t hash = 1469598103934665603ull;
  for (const auto& [name, value] : describe_config(config)) {
    for (char ch : name + "=" + value + ";") {
      hash ^= static_cast<unsigned char>(ch);
      hash *= 1099511628211ull;
    }
  }
  return hash;
}

}  // namespace scalestudy
