#include "bench/bench_common.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <limits>
#include <sstream>

#include "results/complete_mark.h"
#include "results/hdf5_check.h"
#include "core/enum_names.h"
#include "core/usage_error.h"
#include "results/hdf5_io.h"
#include "results/kernel_trace_writer.h"
#include "results/provenance.h"
#include "results/run_summary.h"
#include "control/mpi_check.h"

namespace scalestudy {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) parts.push_back(trim(part));
  if (!text.empty() && text.back() == separator) parts.push_back("");
  return parts;
}

[[noreturn]] void bad_value(const std::string& option, const std::string& value, const std::string& why) {
  throw UsageError("--" + option + " " + value + ": " + why);
}

void write_float64(hid_t parent, const std::string& name, const std::vector<hsize_t>& shape,
                   const std::vector<double>& values) {
  h5::Handle space(CHECK_HDF5(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr)));
  h5::Handle dataset(CHECK_HDF5(
      H5Dcreate2(parent, name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  if (!values.empty())
    CHECK_HDF5(H5Dwrite(dataset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
}

void describe_dataset(hid_t parent, const std::string& name, const std::string& units,
                      const std::string& description) {
  h5::Handle dataset(CHECK_HDF5(H5Dopen2(parent, name.c_str(), H5P_DEFAULT)));
  if (!units.empty()) h5::set_attribute(dataset.get(), "units", units);
  h5::set_attribute(dataset.get(), "description", description);
}

}  // namespace

// ---- names and parsing ------------------------------------------------------------------

namespace {

constexpr EnumNames<BenchKind, kBenchKindCount> kBenchKindNames{{"gemm", "bandwidth", "layer", "inference", "comm"},
                                                                "?"};
static_assert(kBenchKindNames.complete());

constexpr EnumNames<PointStatus, kPointStatusCount> kPointStatusNames{{"ok", "oom", "unavailable", "wrong"}, "?"};
static_assert(kPointStatusNames.complete());

}  // namespace

const char* bench_kind_name(BenchKind kind) { return kBenchKindNames.name(kind); }

BenchKind parse_bench_kind(const std::string& name) {
  if (const std::optional<BenchKind> kind = kBenchKindNames.find(name)) return *kind;
  throw UsageError("unknown benchmark '" + name + "' (known: " + join(kBenchKindNames.all(), ", ") + ")");
}

namespace {

// One size of `whole` (the option's value, which error messages name).
int64_t parse_size_item(const std::string& option, const std::string& item, const std::string& whole) {
  const std::string value = trim(item);
  int64_t multiplier = 1;
  std::string digits = value;
  if (!value.empty()) {
    switch (value.back()) {
      case 'K': case 'k': multiplier = int64_t{1} << 10; break;
      case 'M': case 'm': multiplier = int64_t{1} << 20; break;
      case 'G': case 'g': multiplier = int64_t{1} << 30; break;
      default: break;
    }
  }
  if (multiplier != 1) digits.pop_back();
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    bad_value(option, whole, "expected sizes such as 4096, 16K, 64M or 1G");
  if (digits.size() > 12 || std::stoll(digits) > std::numeric_limits<int64_t>::max() / multiplier / 2)
    bad_value(option, whole, "too large");
  const int64_t number = std::stoll(digits);
  if (number <= 0) bad_value(option, whole, "must be positive");
  return number * multiplier;
}

}  // namespace

int64_t parse_size(const std::string& option, const std::string& text) {
  return parse_size_item(option, text, text);
}

std::vector<int64_t> parse_size_list(const std::string& option, const std::string& text) {
  std::vector<int64_t> sizes;
  for (const std::string& item : split(text, ',')) {
    const size_t dots = item.find("..");
    if (dots == std::string::npos) {
      sizes.push_back(parse_size_item(option, item, text));
      continue;
    }
    const int64_t first = parse_size_item(option, item.substr(0, dots), text);
    const int64_t last = parse_size_item(option, item.substr(dots + 2), text);
    if (last < first) bad_value(option, text, "a range A..B needs A <= B");
    for (int64_t size = first; size <= last; size *= 2) sizes.push_back(size);
  }
  if (sizes.empty()) bad_value(option, text, "expected at least one size");
  return sizes;
}

std::vector<std::string> parse_name_list(const std::string& option, const std::string& text,
                                         const std::vector<std::string>& allowed) {
  std::vector<std::string> names;
  for (const std::string& name : split(text, ',')) {
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end())
      bad_value(option, text, "'" + name + "' is not one of " + join(allowed, ", "));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  if (names.empty()) bad_value(option, text, "expected at least one of " + join(allowed, ", "));
  return names;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : separator) + part;
  return out;
}

// ---- timing -------------------------------------------------------------------------------

SampleStats summarize_samples(const std::vector<double>& samples_s) {
  return {quantile(samples_s, 0.5), quantile(samples_s, 0.25), quantile(samples_s, 0.75)};
}

int calls_for(double seconds_per_call, double min_sample_s) {
  if (!(seconds_per_call > 0.0)) return kMaxCallsPerSample;
  const double wanted = std::ceil(min_sample_s / seconds_per_call);
  return static_cast<int>(std::clamp(wanted, 1.0, static_cast<double>(kMaxCallsPerSample)));
}

TimedCalls time_calls(StepTimer& timer, const std::function<void()>& call, int warmup, int repeats,
                      double min_sample_s, const TimingHooks& hooks) {
  SCALESTUDY_CHECK(warmup >= 1 && repeats >= 1, "time_calls needs a warm-up sample and a repeat");
  auto sample = [&](int calls) {
    if (hooks.before_sample) hooks.before_sample();
    timer.start_step();
    for (int i = 0; i < calls; ++i) call();
    timer.mark();
    const std::vector<double> marks = timer.finish_step();
    return marks.back() / calls;
  };
  TimedCalls timed;
  // The first call pays for lazy initialisation (cuBLAS heuristics, page faults), so the
  // count is refined after every warm-up sample and the last one decides.
  int calls = 1;
  for (int i = 0; i < warmup; ++i) {
    calls = calls_for(sample(calls), min_sample_s);
    if (hooks.agree_calls) calls = hooks.agree_calls(calls);
  }
  timed.calls_per_sample = calls;
  for (int i = 0; i < repeats; ++i) timed.samples_s.push_back(sample(calls));
  timed.stats = summarize_samples(timed.samples_s);
  if (hooks.tracer) {
    hooks.tracer->start();
    (void)sample(calls);  // finish_step waits for the sample's GPU work
    hooks.tracer->collect(hooks.trace_label);
    hooks.tracer->stop();
  }
  return timed;
}

// ---- memory -------------------------------------------------------------------------------

size_t available_memory_bytes(const Backend& backend, const BenchConfig& config) {
  size_t available = backend.available_bytes();
  if (config.memory_limit_bytes > 0) available = std::min(available, config.memory_limit_bytes);
  return available;
}

// ---- the table ----------------------------------------------------------------------------

const char* point_status_name(PointStatus status) { return kPointStatusNames.name(status); }

PointTable::PointTable(int repeats) : repeats_(repeats) {
  add_text("status", "ok, oom (predicted not to fit in the memory available; not run), unavailable "
                     "(not offered by this backend), or wrong (a result check failed)");
  add_text("detail", "why a point is not ok; empty when it is");
  add_float("time_median_s", "s", "median over the timed samples of the time per call");
  add_float("time_q1_s", "s", "25 % quantile of the time per call");
  add_float("time_q3_s", "s", "75 % quantile of the time per call");
  add_int("calls_per_sample", "", "back-to-back calls timed together in one sample");
}

void PointTable::add_column(const std::string& name, Type type, const std::string& units,
                            const std::string& description) {
  SCALESTUDY_CHECK(columns_.count(name) == 0 && rows() == 0, "column " + name + " added twice or late");
  order_.push_back(name);
  Column& c = columns_[name];
  c.type = type;
  c.units = units;
  c.description = description;
}

void PointTable::add_float(const std::string& name, const std::string& units, const std::string& description) {
  add_column(name, Type::number, units, description);
}
void PointTable::add_int(const std::string& name, const std::string& units, const std::string& description) {
  add_column(name, Type::integer, units, description);
}
void PointTable::add_text(const std::string& name, const std::string& description) {
  add_column(name, Type::text, "", description);
}

size_t PointTable::add_row() {
  for (auto& [name, c] : columns_) {
    if (c.type == Type::number) c.numbers.push_back(kNaN);
    if (c.type == Type::integer) c.integers.push_back(0);
    if (c.type == Type::text) c.texts.push_back("");
  }
  status_.push_back(PointStatus::ok);
  samples_s_.emplace_back(static_cast<size_t>(repeats_), kNaN);
  columns_["status"].texts.back() = "ok";
  return rows() - 1;
}

PointTable::Column& PointTable::column(const std::string& name, Type type) {
  auto found = columns_.find(name);
  SCALESTUDY_CHECK(found != columns_.end() && found->second.type == type, "no such column: " + name);
  return found->second;
}

const PointTable::Column& PointTable::column(const std::string& name) const {
  auto found = columns_.find(name);
  SCALESTUDY_CHECK(found != columns_.end(), "no such column: " + name);
  return found->second;
}

void PointTable::set(size_t row, const std::string& name, double value) { column(name, Type::number).numbers.at(row) = value; }
void PointTable::set(size_t row, const std::string& name, int64_t value) { column(name, Type::integer).integers.at(row) = value; }
void PointTable::set(size_t row, const std::string& name, const std::string& value) {
  column(name, Type::text).texts.at(row) = value;
}

void PointTable::set_status(size_t row, PointStatus status, const std::string& detail) {
  status_.at(row) = status;
  set(row, "status", point_status_name(status));
  set(row, "detail", detail);
}

void PointTable::set_timing(size_t row, const TimedCalls& timed) {
  set(row, "time_median_s", timed.stats.median_s);
  set(row, "time_q1_s", timed.stats.q1_s);
  set(row, "time_q3_s", timed.stats.q3_s);
  set(row, "calls_per_sample", static_cast<int64_t>(timed.calls_per_sample));
  std::vector<double>& samples = samples_s_.at(row);
  for (size_t i = 0; i < samples.size() && i < timed.samples_s.size(); ++i) samples[i] = timed.samples_s[i];
}

double PointTable::number(size_t row, const std::string& name) const { return column(name).numbers.at(row); }
int64_t PointTable::integer(size_t row, const std::string& name) const { return column(name).integers.at(row); }
const std::string& PointTable::text(size_t row, const std::string& name) const { return column(name).texts.at(row); }

void PointTable::write(hid_t group) const {
  // Only an abort before the first point leaves no rows; the file is marked failed then.
  if (rows() == 0) return;
  const hsize_t points = rows();
  for (const std::string& name : order_) {
    const Column& c = columns_.at(name);
    if (c.type == Type::number) write_float64(group, name, {points}, c.numbers);
    if (c.type == Type::integer) h5::write_int64(group, name, {points}, c.integers);
    if (c.type == Type::text) h5::write_strings(group, name, c.texts);
    describe_dataset(group, name, c.units, c.description);
  }
  std::vector<double> samples;
  for (const auto& row : samples_s_) samples.insert(samples.end(), row.begin(), row.end());
  write_float64(group, "samples_s", {points, static_cast<hsize_t>(repeats_)}, samples);
  describe_dataset(group, "samples_s", "s", "time per call of every timed sample [point, repeat]; NaN where not run");
}

std::string PointTable::render(const std::vector<std::string>& names) const {
  std::vector<std::vector<std::string>> cells(rows() + 1);
  for (const std::string& name : names) {
    const Column& c = column(name);
    cells[0].push_back(c.units.empty() ? name : name + " [" + c.units + "]");
    for (size_t r = 0; r < rows(); ++r) {
      char text[64];
      if (c.type == Type::text) {
        cells[r + 1].push_back(c.texts[r]);
        continue;
      }
      if (c.type == Type::integer) std::snprintf(text, sizeof(text), "%lld", static_cast<long long>(c.integers[r]));
      else if (std::isnan(c.numbers[r])) std::snprintf(text, sizeof(text), "-");
      else std::snprintf(text, sizeof(text), "%.4g", c.numbers[r]);
      cells[r + 1].push_back(text);
    }
  }
  std::vector<size_t> widths(names.size(), 0);
  for (const auto& line : cells)
    for (size_t i = 0; i < line.size(); ++i) widths[i] = std::max(widths[i], line[i].size());
  std::string out;
  for (const auto& line : cells) {
    for (size_t i = 0; i < line.size(); ++i) {
      out += std::string(widths[i] - line[i].size(), ' ') + line[i];
      out += i + 1 < line.size() ? "  " : "\n";
    }
  }
  return out;
}

// ---- context ------------------------------------------------------------------------------

void BenchContext::progress(const std::string& line) const {
  if (rank != 0) return;
  std::printf("  %s\n", line.c_str());
  std::fflush(stdout);
}

std::string BenchContext::timer_description() const {
  if (backend.name() == "cuda") return "CUDA events recorded on the compute stream around the calls";
  return "std::chrono::steady_clock on the calling thread around the calls";
}

void describe_model(std::map<std::string, std::string>& method, const std::string& model, const ModelShape& shape) {
  method["model"] = model;
  method["layers"] = std::to_string(shape.layers);
  method["hidden"] = std::to_string(shape.channels);
  method["heads"] = std::to_string(shape.heads);
  method["vocab"] = std::to_string(shape.vocab);
  method["max_seq"] = std::to_string(shape.max_seq);
  method["attention"] = shape.causal ? "causal" : "bidirectional";
}

void describe_model_run(std::map<std::string, std::string>& method, const BenchConfig& config,
                        const ModelShape& shape) {
  describe_model(method, config.model, shape);
  method["precision"] = precision_name(config.precision);
  method["attention_kernel"] =
      attention_kernel_used(config.attention_kernel, config.backend == "cuda", config.precision);
}

// ---- the file -----------------------------------------------------------------------------

namespace {

std::atomic<BenchFile*> active_bench_file{nullptr};

void mark_bench_failed_on_abort(const std::string& reason) {
  if (BenchFile* file = active_bench_file.exchange(nullptr)) file->finish(reason.empty() ? "aborted" : reason);
}

}  // namespace

BenchFile::BenchFile(const OutputPathCheck& output, BenchKind kind, const RunIdentity& identity,
                     const std::string& precision, MPI_Comm world)
    : output_(output.output), partial_(output.output + ".partial"), kind_(kind) {
  CHECK_MPI(MPI_Comm_rank(world, &rank_));
  const ProvenanceHeader header = provenance_header(identity, precision, world);
  if (output_.empty()) return;
  lock_ = lock_output(output, world);
  if (rank_ != 0) return;

  file_ = create_partial_file(*lock_);
  write_provenance_header(file_, header);
  h5::set_attribute(file_, "bench", bench_kind_name(kind_));
  CHECK_HDF5(H5Fflush(file_, H5F_SCOPE_GLOBAL));
  active_bench_file.store(this);
  set_abort_hook(mark_bench_failed_on_abort);
}

BenchFile::~BenchFile() {
  if (file_ >= 0) finish("the benchmark ended without completing (an exception or early exit)");
}

void BenchFile::watch(const PointTable* table, const std::map<std::string, std::string>* method) {
  table_ = table;
  method_ = method;
}

std::string BenchFile::finish(const std::string& failure_reason) {
  if (file_ < 0) return failure_reason;
  active_bench_file.store(nullptr);
  set_abort_hook(nullptr);
  const std::string marked = write_and_close(failure_reason.empty() ? "complete" : "failed",
                                             failure_reason.substr(0, failure_reason.find('\n')));
  lock_.reset();
  return failure_reason.empty() ? marked : failure_reason;
}

void BenchFile::write_kernel_trace(const std::vector<RankTrace>& traces, int64_t last_point) {
  if (file_ < 0) return;
  KernelTraceWindow window;
  window.first = 0;
  window.last = last_point;
  window.units = "point";
  scalestudy::write_kernel_trace(file_, traces, window);
}

std::string BenchFile::write_and_close(const std::string& status, const std::string& reason) {
  const hid_t file = file_;
  file_ = -1;
  {
    h5::Handle benches = h5::create_group(file, "bench");
    h5::Handle group = h5::create_group(benches.get(), bench_kind_name(kind_));
    if (method_)
      for (const auto& [key, value] : *method_) h5::set_attribute(group.get(), key, value);
    if (table_) table_->write(group.get());
  }
  if (status == "complete") {
    { h5::Handle closing(file); }
    return mark_complete({.partial = partial_, .output = output_, .steps_rows = std::nullopt});
  }
  h5::set_attribute(file, "status", status);
  h5::set_attribute(file, "failure_reason", reason);
  h5::set_attribute(file, "end_time", utc_now());
  CHECK_HDF5(H5Fflush(file, H5F_SCOPE_GLOBAL));
  { h5::Handle closing(file); }
  give_final_name(partial_, output_);
  return reason;
}

}  // namespace scalestudy
