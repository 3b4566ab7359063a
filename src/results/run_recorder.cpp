#include "results/run_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <sstream>

#include "control/control_wait.h"
#include "control/mpi_check.h"
#include "results/hdf5_check.h"
#include "model/flops.h"
#include "results/hdf5_io.h"
#include "results/complete_mark.h"
#include "results/kernel_trace_writer.h"
#include "results/provenance.h"

namespace scalestudy {
namespace {

// A collective record travels as this many doubles: kind, phase, begin, end, payload
// bytes (exact in a double below 2^53), wait begin, wait end.
constexpr int kRecordDoubles = 7;

int phase_index(const std::string& phase) {
  const auto& names = phase_names();
  for (int p = 0; p < kPhaseCount; ++p)
    if (phase == names[static_cast<size_t>(p)]) return p;
  return static_cast<int>(Phase::step);
}

// The GPU state's float datasets under /steps (docs/results-schema.md, "The GPUs' state").
struct GpuQuantity {
  const char* dataset;
  const char* units;  // "" for a fraction
  double StepGpuState::*member;
};
const std::array<GpuQuantity, 5>& gpu_quantities() {
  static const std::array<GpuQuantity, 5> quantities{{
      {"gpu_sm_clock_mhz", "MHz", &StepGpuState::sm_clock_mhz},
      {"gpu_sm_clock_min_mhz", "MHz", &StepGpuState::sm_clock_min_mhz},
      {"gpu_power_w", "W", &StepGpuState::power_w},
      {"gpu_temperature_c", "degC", &StepGpuState::temperature_c},
      {"gpu_power_capped", "", &StepGpuState::power_capped},
  }};
  return quantities;
}

// Strings of every rank, gathered to rank 0 through fixed-size slots.
std::vector<std::string> to_strings(const auto& names) { return {std::begin(names), std::end(names)}; }

std::vector<std::string> collective_names() {
  std::vector<std::string> names;
  for (int k = 0; k < kCollectiveKindCount; ++k) names.push_back(collective_kind_name(static_cast<CollectiveKind>(k)));
  return names;
}

std::vector<std::string> memory_kind_names() {
  std::vector<std::string> names;
  for (int k = 0; k < kMemoryKindCount; ++k) names.push_back(memory_kind_name(static_cast<MemoryKind>(k)));
  return names;
}

}  // namespace

std::string result_config_hash(const RunConfig& config) {
  std::map<std::string, std::string> sorted;
  for (const auto& [key, value] : describe_config(config))
    if (key != "output" && key != "repeat") sorted[key] = value;
  uint64_t hash = 1469598103934665603ull;
  for (const auto& [key, value] : sorted)
    for (char ch : key + "=" + value + "\n") {
      hash ^= static_cast<unsigned char>(ch);
      hash *= 1099511628211ull;
    }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

// The HDF5 file, on rank 0.
class RunRecorder::File {
 public:
  File(std::unique_ptr<OutputLock> lock, const RunConfig& config, const ProvenanceHeader& header,
       const std::optional<MemoryPreflightRecord>& memory)
      : lock_(std::move(lock)), output_(lock_->output()), partial_(output_ + ".partial"), world_(config.world_size) {
    file_ = h5::Handle(create_partial_file(*lock_));
    const hid_t root = file_.get();
    write_provenance_header(root, header);
    // With the header: root attributes added once the steps exist leave a file that a
    // full disk can make unreadable when it is closed.
    if (memory) write_memory_estimate(memory->estimate, memory->available_bytes);

    h5::Handle config_group = h5::create_group(root, "config");
    for (const auto& [key, value] : describe_config(config)) h5::set_attribute(config_group.get(), key, value);
    h5::set_attribute(config_group.get(), "config_hash", result_config_hash(config));

    steps_group_ = h5::create_group(root, "steps");
    h5::set_attribute(steps_group_.get(), "phase_names", to_strings(phase_names()));
    const hid_t steps = steps_group_.get();
    const hsize_t R = static_cast<hsize_t>(world_);
    intervals_ = std::make_unique<h5::GrowingDataset>(steps, "intervals", H5T_NATIVE_DOUBLE,
                                                      std::vector<hsize_t>{R, kPhaseCount, 2}, 16);
    h5::set_attribute(intervals_->id(), "units", "s");
    loss_ = std::make_unique<h5::GrowingDataset>(steps, "loss", H5T_NATIVE_DOUBLE, std::vector<hsize_t>{}, 256);
    tokens_ = std::make_unique<h5::GrowingDataset>(steps, "tokens", H5T_NATIVE_INT64, std::vector<hsize_t>{}, 256);
    h5::set_attribute(tokens_->id(), "units", "tokens");
    warmup_ = std::make_unique<h5::GrowingDataset>(steps, "warmup", H5T_NATIVE_UINT8, std::vector<hsize_t>{}, 256);
    traced_ = std::make_unique<h5::GrowingDataset>(steps, "traced", H5T_NATIVE_UINT8, std::vector<hsize_t>{}, 256);
    step_index_ = std::make_unique<h5::GrowingDataset>(steps, "step_index", H5T_NATIVE_INT64, std::vector<hsize_t>{}, 256);
    loss_scale_ = std::make_unique<h5::GrowingDataset>(steps, "loss_scale", H5T_NATIVE_DOUBLE, std::vector<hsize_t>{}, 256);
    skipped_ = std::make_unique<h5::GrowingDataset>(steps, "skipped", H5T_NATIVE_UINT8, std::vector<hsize_t>{}, 256);
    comm_bytes_ = std::make_unique<h5::GrowingDataset>(steps, "comm_bytes", H5T_NATIVE_INT64,
                                                       std::vector<hsize_t>{kCollectiveKindCount}, 256);
    h5::set_attribute(comm_bytes_->id(), "units", "bytes");
    h5::set_attribute(comm_bytes_->id(), "collective_names", collective_names());
    const std::vector<hsize_t> per_rank{R};
    gpu_samples_ = std::make_unique<h5::GrowingDataset>(steps, "gpu_samples", H5T_NATIVE_INT64, per_rank, 64);
    gpu_reasons_ =
        std::make_unique<h5::GrowingDataset>(steps, "gpu_clock_event_reasons", H5T_NATIVE_INT64, per_rank, 64);
    for (const GpuQuantity& quantity : gpu_quantities()) {
      gpu_values_.push_back(
          std::make_unique<h5::GrowingDataset>(steps, quantity.dataset, H5T_NATIVE_DOUBLE, per_rank, 64));
      if (*quantity.units) h5::set_attribute(gpu_values_.back()->id(), "units", quantity.units);
    }
    const std::vector<hsize_t> per_rank_phase{R, kPhaseCount};
    gpu_phase_samples_ =
        std::make_unique<h5::GrowingDataset>(steps, "gpu_phase_samples", H5T_NATIVE_INT64, per_rank_phase, 64);
    gpu_phase_clock_ =
        std::make_unique<h5::GrowingDataset>(steps, "gpu_phase_sm_clock_mhz", H5T_NATIVE_DOUBLE, per_rank_phase, 64);
    h5::set_attribute(gpu_phase_clock_->id(), "units", "MHz");
    gpu_phase_power_ =
        std::make_unique<h5::GrowingDataset>(steps, "gpu_phase_power_w", H5T_NATIVE_DOUBLE, per_rank_phase, 64);
    h5::set_attribute(gpu_phase_power_->id(), "units", "W");

    collectives_group_ = h5::create_group(root, "collectives");
    const hid_t coll = collectives_group_.get();
    h5::set_attribute(coll, "collective_names", collective_names());
    h5::set_attribute(coll, "phase_names", to_strings(phase_names()));
    const std::vector<hsize_t> scalar;
    c_step_ = std::make_unique<h5::GrowingDataset>(coll, "step", H5T_NATIVE_INT64, scalar, 1024);
    c_rank_ = std::make_unique<h5::GrowingDataset>(coll, "rank", H5T_NATIVE_INT32, scalar, 1024);
    c_kind_ = std::make_unique<h5::GrowingDataset>(coll, "kind", H5T_NATIVE_INT32, scalar, 1024);
    c_phase_ = std::make_unique<h5::GrowingDataset>(coll, "phase", H5T_NATIVE_INT32, scalar, 1024);
    c_begin_ = std::make_unique<h5::GrowingDataset>(coll, "begin", H5T_NATIVE_DOUBLE, scalar, 1024);
    c_end_ = std::make_unique<h5::GrowingDataset>(coll, "end", H5T_NATIVE_DOUBLE, scalar, 1024);
    c_bytes_ = std::make_unique<h5::GrowingDataset>(coll, "payload_bytes", H5T_NATIVE_INT64, scalar, 1024);
    c_wait_begin_ = std::make_unique<h5::GrowingDataset>(coll, "wait_begin", H5T_NATIVE_DOUBLE, scalar, 1024);
    c_wait_end_ = std::make_unique<h5::GrowingDataset>(coll, "wait_end", H5T_NATIVE_DOUBLE, scalar, 1024);
    for (auto* dataset : {c_begin_.get(), c_end_.get(), c_wait_begin_.get(), c_wait_end_.get()})
      h5::set_attribute(dataset->id(), "units", "s");
    h5::set_attribute(c_bytes_->id(), "units", "bytes");
    CHECK_HDF5(H5Fflush(root, H5F_SCOPE_GLOBAL));
  }

  void append(const GatheredStep& step, const std::array<size_t, kCollectiveKindCount>& comm_bytes) {
    std::vector<double> intervals;
    for (const PhaseIntervals& rank : step.intervals)
      for (const Interval& interval : rank) {
        intervals.push_back(interval.begin);
        intervals.push_back(interval.end);
      }
    intervals_->append(intervals.data(), 1);
    loss_->append(&step.loss, 1);
    tokens_->append(&step.tokens, 1);
    const uint8_t warmup = step.warmup ? 1 : 0;
    warmup_->append(&warmup, 1);
    const uint8_t traced = step.traced ? 1 : 0;
    traced_->append(&traced, 1);
    step_index_->append(&step.step_index, 1);
    loss_scale_->append(&step.loss_scale, 1);
    const uint8_t skipped = step.skipped ? 1 : 0;
    skipped_->append(&skipped, 1);
    std::array<int64_t, kCollectiveKindCount> bytes{};
    for (int k = 0; k < kCollectiveKindCount; ++k) bytes[k] = static_cast<int64_t>(comm_bytes[k]);
    comm_bytes_->append(bytes.data(), 1);
    SCALESTUDY_CHECK(step.gpu_state.size() == static_cast<size_t>(world_), "a step's GPU state must hold every rank");
    std::vector<int64_t> samples, reasons;
    std::vector<std::vector<double>> values(gpu_values_.size());
    for (const StepGpuState& state : step.gpu_state) {
      samples.push_back(state.samples);
      reasons.push_back(state.clock_event_reasons);
      const auto& quantities = gpu_quantities();
      for (size_t q = 0; q < quantities.size(); ++q) values[q].push_back(state.*quantities[q].member);
    }
    gpu_samples_->append(samples.data(), 1);
    gpu_reasons_->append(reasons.data(), 1);
    for (size_t q = 0; q < values.size(); ++q) gpu_values_[q]->append(values[q].data(), 1);
    SCALESTUDY_CHECK(step.gpu_phases.size() == static_cast<size_t>(world_), "a step's GPU phases must hold every rank");
    std::vector<int64_t> phase_samples;
    std::vector<double> phase_clock, phase_power;
    for (const PhaseGpuStates& rank : step.gpu_phases)
      for (const PhaseGpuState& phase : rank) {
        phase_samples.push_back(phase.samples);
        phase_clock.push_back(phase.sm_clock_mhz);
        phase_power.push_back(phase.power_w);
      }
    gpu_phase_samples_->append(phase_samples.data(), 1);
    gpu_phase_clock_->append(phase_clock.data(), 1);
    gpu_phase_power_->append(phase_power.data(), 1);

    std::vector<int64_t> c_step, c_bytes;
    std::vector<int32_t> c_rank, c_kind, c_phase;
    std::vector<double> c_begin, c_end, c_wait_begin, c_wait_end;
    for (size_t r = 0; r < step.collectives.size(); ++r)
      for (const CollectiveRecord& c : step.collectives[r]) {
        c_step.push_back(step.step_index);
        c_rank.push_back(static_cast<int32_t>(r));
        c_kind.push_back(static_cast<int32_t>(c.kind));
        c_phase.push_back(phase_index(c.phase));
        c_begin.push_back(c.begin_s);
        c_end.push_back(c.end_s);
        c_bytes.push_back(static_cast<int64_t>(c.payload_bytes));
        c_wait_begin.push_back(c.wait_begin_s);
        c_wait_end.push_back(c.wait_end_s);
      }
    const hsize_t n = c_step.size();
    c_step_->append(c_step.data(), n);
    c_rank_->append(c_rank.data(), n);
    c_kind_->append(c_kind.data(), n);
    c_phase_->append(c_phase.data(), n);
    c_begin_->append(c_begin.data(), n);
    c_end_->append(c_end.data(), n);
    c_bytes_->append(c_bytes.data(), n);
    c_wait_begin_->append(c_wait_begin.data(), n);
    c_wait_end_->append(c_wait_end.data(), n);
  }

  void flush() { CHECK_HDF5(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL)); }

  void write_trace(const std::vector<RankTrace>& traces, const KernelTraceWindow& window) {
    write_kernel_trace(file_.get(), traces, window);
    flush();
  }

  void write_memory_estimate(const MemoryEstimate& estimate, size_t available_bytes) {
    const hid_t root = file_.get();
    std::vector<int64_t> by_kind;
    for (size_t kind_bytes : estimate.bytes) by_kind.push_back(static_cast<int64_t>(kind_bytes));
    h5::set_attribute(root, "memory_estimate_bytes", static_cast<int64_t>(estimate.total_bytes()));
    h5::set_attribute(root, "memory_estimate_by_kind", by_kind);
    h5::set_attribute(root, "memory_available_bytes", static_cast<int64_t>(available_bytes));
  }

  void write_memory(const std::vector<int64_t>& bytes, const std::vector<int64_t>& peak, const std::string& source) {
    h5::Handle memory = h5::create_group(file_.get(), "memory");
    h5::write_int64(memory.get(), "bytes", {static_cast<hsize_t>(world_), kMemoryKindCount}, bytes);
    h5::write_int64(memory.get(), "peak_bytes", {static_cast<hsize_t>(world_)}, peak);
    h5::Handle bytes_set(CHECK_HDF5(H5Dopen2(memory.get(), "bytes", H5P_DEFAULT)));
    h5::set_attribute(bytes_set.get(), "units", "bytes");
    h5::set_attribute(bytes_set.get(), "kind_names", memory_kind_names());
    h5::Handle peak_set(CHECK_HDF5(H5Dopen2(memory.get(), "peak_bytes", H5P_DEFAULT)));
    h5::set_attribute(peak_set.get(), "units", "bytes");
    h5::set_attribute(peak_set.get(), "peak_source", source);
  }

  void write_summary(const RunSummary& s) {
    h5::Handle summary = h5::create_group(file_.get(), "summary");
    const hid_t g = summary.get();
    h5::set_attribute(g, "steps_measured", s.steps_measured);
    h5::set_attribute(g, "step_time_median_s", s.step_time_median_s);
    h5::set_attribute(g, "step_time_q1_s", s.step_time_q1_s);
    h5::set_attribute(g, "step_time_q3_s", s.step_time_q3_s);
    h5::set_attribute(g, "tokens_per_s", s.tokens_per_s);
    h5::set_attribute(g, "flops_per_step", s.flops_per_step);
    h5::set_attribute(g, "recompute_flops_per_step", s.recompute_flops_per_step);
    h5::set_attribute(g, "tflops_per_gpu", s.tflops_per_gpu);
    h5::set_attribute(g, "peak_tflops_per_gpu", s.peak_tflops_per_gpu);
    h5::set_attribute(g, "peak_source", s.peak_source);
    h5::set_attribute(g, "mfu", s.mfu);
    h5::set_attribute(g, "comm_time_median_s", s.comm_time_median_s);
    h5::set_attribute(g, "exposed_comm_median_s", s.exposed_comm_median_s);
    h5::set_attribute(g, "exposed_comm_fraction", s.exposed_comm_fraction);
    h5::set_attribute(g, "comm_fraction_of_step", s.comm_fraction_of_step);
  }

  // Closes the file, and marks it complete once it reads back whole with `steps` rows
  // (results/complete_mark.h). Returns "" when it is complete, else why it is failed.
  std::string close_complete(hsize_t steps) {
    close_handles();
    return mark_complete({.partial = partial_, .output = output_, .steps_rows = steps});
  }

  // Sets the status failed with the reason, closes the file and gives it its final name.
  // A failed run closes its file as well as it still can: where the failure was the file's
  // own (a full disk), the status may not be written, and the file is still closed and
  // renamed, keeping every step flushed before.
  void close_failed(const std::string& reason) {
    if (file_.get() < 0) return;
    const bool marked = h5::try_set_attribute(file_.get(), "status", "failed") &&
                        h5::try_set_attribute(file_.get(), "failure_reason", reason) &&
                        h5::try_set_attribute(file_.get(), "end_time", utc_now());
    if (!marked)
      std::fprintf(stderr, "scalestudy: %s could not be marked failed (%s); its flushed steps remain\n",
                   output_.c_str(), hdf5_error_string().c_str());
    close_handles();
    give_final_name(partial_, output_);
  }

 private:
  // Every dataset, group and the file; closing the file writes what HDF5 still held.
  void close_handles() {
    for (auto* dataset : {&intervals_, &loss_, &tokens_, &warmup_, &traced_, &step_index_, &loss_scale_, &skipped_, &comm_bytes_, &c_step_, &c_rank_,
                          &c_kind_, &c_phase_, &c_begin_, &c_end_, &c_bytes_, &c_wait_begin_, &c_wait_end_})
      dataset->reset();
    gpu_samples_.reset();
    gpu_reasons_.reset();
    gpu_values_.clear();
    gpu_phase_samples_.reset();
    gpu_phase_clock_.reset();
    gpu_phase_power_.reset();
    steps_group_.reset();
    collectives_group_.reset();
    file_.reset();
  }

  // First, so that it is released last: after the file has its final name.
  std::unique_ptr<OutputLock> lock_;
  std::string output_, partial_;
  int world_;
  h5::Handle file_, steps_group_, collectives_group_;
  std::unique_ptr<h5::GrowingDataset> intervals_, loss_, tokens_, warmup_, traced_, step_index_, loss_scale_, skipped_,
      comm_bytes_, gpu_samples_, gpu_reasons_;
  std::vector<std::unique_ptr<h5::GrowingDataset>> gpu_values_;  // gpu_quantities()'s, in order
  std::unique_ptr<h5::GrowingDataset> gpu_phase_samples_, gpu_phase_clock_, gpu_phase_power_;
  std::unique_ptr<h5::GrowingDataset> c_step_, c_rank_, c_kind_, c_phase_, c_begin_, c_end_, c_bytes_,
      c_wait_begin_, c_wait_end_;
};

namespace {

// The recorder whose file an abort on this rank marks failed.
std::atomic<RunRecorder*> active_recorder{nullptr};

void mark_failed_on_abort(const std::string& reason) {
  if (RunRecorder* recorder = active_recorder.exchange(nullptr)) recorder->finish_failed(reason);
}

}  // namespace

RunRecorder::RunRecorder(const RunConfig& config, const RunIdentity& identity, MPI_Comm control,
                         const std::optional<MemoryPreflightRecord>& memory)
    : config_(config), identity_(identity), control_(control), output_(config.output) {
  CHECK_MPI(MPI_Comm_rank(control_, &rank_));
  CHECK_MPI(MPI_Comm_size(control_, &world_size_));
  const ProvenanceHeader header = provenance_header(identity, precision_name(config.precision), control_);
  if (output_.empty()) return;
  std::unique_ptr<OutputLock> lock =
      lock_output({.output = output_, .overwrite = config.overwrite, .inputs = {}}, control_);
  if (rank_ == 0) {
    file_ = std::make_unique<File>(std::move(lock), config_, header, memory);
    active_recorder.store(this);
    set_abort_hook(mark_failed_on_abort);
  }
}

RunRecorder::~RunRecorder() {
  if (file_) finish_failed("the run ended without completing (an exception or early exit)");
}

namespace {

// Per rank: the intervals, the GPU state, then its phases' (counts and bits are exact in a
// double).
constexpr int kGpuStateDoubles = 7;
constexpr int kGpuPhaseDoubles = 3 * kPhaseCount;
constexpr int kRankDoubles = 2 * kPhaseCount + kGpuStateDoubles + kGpuPhaseDoubles;

std::array<double, kRankDoubles> pack_rank_doubles(const StepRecord& record) {
  std::array<double, kRankDoubles> mine{};
  for (int p = 0; p < kPhaseCount; ++p) {
    mine[2 * p] = record.intervals[p].begin;
    mine[2 * p + 1] = record.intervals[p].end;
  }
  const StepGpuState& gpu = record.gpu_state;
  const std::array<double, kGpuStateDoubles> gpu_doubles{
      static_cast<double>(gpu.samples), gpu.sm_clock_mhz, gpu.sm_clock_min_mhz, gpu.power_w,
      gpu.temperature_c, gpu.power_capped, static_cast<double>(gpu.clock_event_reasons)};
  std::copy(gpu_doubles.begin(), gpu_doubles.end(), mine.begin() + 2 * kPhaseCount);
  for (int p = 0; p < kPhaseCount; ++p) {
    const PhaseGpuState& phase = record.gpu_phases[static_cast<size_t>(p)];
    double* slot = mine.data() + 2 * kPhaseCount + kGpuStateDoubles + 3 * p;
    slot[0] = static_cast<double>(phase.samples);
    slot[1] = phase.sm_clock_mhz;
    slot[2] = phase.power_w;
  }
  return mine;
}

// One rank's doubles, as pack_rank_doubles packed them, appended to the gathered step.
void unpack_rank_doubles(const double* theirs, GatheredStep& step) {
  PhaseIntervals intervals{};
  for (int p = 0; p < kPhaseCount; ++p) {
    intervals[p].begin = theirs[2 * p];
    intervals[p].end = theirs[2 * p + 1];
  }
  step.intervals.push_back(intervals);
  const double* their_gpu = theirs + 2 * kPhaseCount;
  StepGpuState state;
  state.samples = static_cast<int64_t>(their_gpu[0]);
  state.sm_clock_mhz = their_gpu[1];
  state.sm_clock_min_mhz = their_gpu[2];
  state.power_w = their_gpu[3];
  state.temperature_c = their_gpu[4];
  state.power_capped = their_gpu[5];
  state.clock_event_reasons = static_cast<int64_t>(their_gpu[6]);
  step.gpu_state.push_back(state);
  PhaseGpuStates phases;
  for (int p = 0; p < kPhaseCount; ++p) {
    const double* slot = their_gpu + kGpuStateDoubles + 3 * p;
    phases[static_cast<size_t>(p)] = {static_cast<int64_t>(slot[0]), slot[1], slot[2]};
  }
  step.gpu_phases.push_back(phases);
}

// Every rank's collective records, kRecordDoubles doubles each, on rank 0: rank r's are
// packed[offsets[r], offsets[r] + counts[r]).
struct GatheredCollectives {
  std::vector<double> packed;
  std::vector<int> counts, offsets;
};

GatheredCollectives gather_collectives(const std::vector<CollectiveRecord>& records, MPI_Comm control, int rank,
                                       int world_size) {
  std::vector<double> packed;
  for (const CollectiveRecord& c : records) {
    packed.insert(packed.end(), {static_cast<double>(c.kind), static_cast<double>(phase_index(c.phase)),
                                 c.begin_s, c.end_s, static_cast<double>(c.payload_bytes), c.wait_begin_s,
                                 c.wait_end_s});
  }
  int count = static_cast<int>(packed.size());
  GatheredCollectives all;
  all.counts.resize(rank == 0 ? world_size : 0);
  all.offsets.resize(all.counts.size());
  control_gather(&count, 1, MPI_INT, all.counts.data(), 0, control, "step record");
  int total = 0;
  for (size_t r = 0; r < all.counts.size(); ++r) {
    all.offsets[r] = total;
    total += all.counts[r];
  }
  all.packed.resize(static_cast<size_t>(total));
  control_gatherv({.send = packed.data(), .count = count, .type = MPI_DOUBLE, .recv = all.packed.data(),
                   .counts = all.counts.data(), .offsets = all.offsets.data(), .root = 0},
                  control, "step record");
  return all;
}

std::vector<CollectiveRecord> unpack_collectives(const GatheredCollectives& all, int rank) {
  const auto& names = phase_names();
  std::vector<CollectiveRecord> collectives;
  for (int at = all.offsets[rank]; at < all.offsets[rank] + all.counts[rank]; at += kRecordDoubles) {
    const double* v = all.packed.data() + at;
    CollectiveRecord c;
    c.kind = static_cast<CollectiveKind>(static_cast<int>(v[0]));
    c.phase = names[static_cast<size_t>(v[1])];
    c.begin_s = v[2];
    c.end_s = v[3];
    c.payload_bytes = static_cast<size_t>(v[4]);
    c.wait_begin_s = v[5];
    c.wait_end_s = v[6];
    collectives.push_back(c);
  }
  return collectives;
}

}  // namespace

void RunRecorder::on_step(const StepRecord& record) {
  GatheredStep step;
  step.step_index = record.step;
  step.warmup = record.warmup;
  step.loss = record.loss;
  step.tokens = record.tokens;
  step.loss_scale = record.loss_scale;
  step.skipped = record.skipped;
  step.traced = record.traced;

  const std::array<double, kRankDoubles> mine = pack_rank_doubles(record);
  std::vector<double> all_ranks(rank_ == 0 ? mine.size() * world_size_ : 0);
  control_gather(mine.data(), kRankDoubles, MPI_DOUBLE, all_ranks.data(), 0, control_, "step record");
  const GatheredCollectives collectives = gather_collectives(record.collectives, control_, rank_, world_size_);
  if (rank_ != 0) return;

  for (int r = 0; r < world_size_; ++r) {
    unpack_rank_doubles(all_ranks.data() + static_cast<size_t>(r) * kRankDoubles, step);
    step.collectives.push_back(unpack_collectives(collectives, r));
  }
  if (file_) {
    file_->append(step, record.comm_bytes);
    if ((record.step + 1) % config_.flush_every == 0) file_->flush();
  }
  steps_.push_back(std::move(step));
}

void RunRecorder::record_kernel_trace(const RankTrace& mine, int first_step, int last_step) {
  const std::vector<RankTrace> traces = gather_traces(control_, mine);
  if (rank_ != 0 || !file_) return;
  const TracingCost cost = tracing_cost(steps_);
  KernelTraceWindow window;
  window.first = first_step;
  window.last = last_step;
  window.units = "step";
  window.traced_step_time_mean_s = cost.traced_step_time_mean_s;
  window.untraced_step_time_median_s = cost.untraced_step_time_median_s;
  file_->write_trace(traces, window);
}

RunSummary RunRecorder::finish_complete(const MemoryReport& memory) {
  std::array<int64_t, kMemoryKindCount + 1> mine{};
  for (int k = 0; k < kMemoryKindCount; ++k) mine[k] = static_cast<int64_t>(memory.bytes[k]);
  mine[kMemoryKindCount] = static_cast<int64_t>(memory.peak_bytes);
  std::vector<int64_t> all(rank_ == 0 ? mine.size() * world_size_ : 0);
  control_gather(mine.data(), kMemoryKindCount + 1, MPI_INT64_T, all.data(), 0, control_, "memory report");
  if (rank_ != 0) return {};

  const double flops = training_flops(config_.shape, config_.global_batch, config_.seq);
  RunSummary summary =
      summarize(steps_, world_size_, flops, identity_.peak_tflops_per_gpu, identity_.peak_source);
  if (config_.recompute)
    summary.recompute_flops_per_step = recompute_flops(config_.shape, config_.global_batch, config_.seq);
  if (file_) {
    std::vector<int64_t> bytes, peak;
    for (int r = 0; r < world_size_; ++r) {
      const int64_t* row = all.data() + static_cast<size_t>(r) * (kMemoryKindCount + 1);
      bytes.insert(bytes.end(), row, row + kMemoryKindCount);
      peak.push_back(row[kMemoryKindCount]);
    }
    file_->write_memory(bytes, peak, memory.peak_source);
    file_->write_summary(summary);
    active_recorder.store(nullptr);
    file_failure_ = file_->close_complete(static_cast<hsize_t>(steps_.size()));
    file_.reset();
  }
  return summary;
}

void RunRecorder::finish_failed(const std::string& reason) {
  if (!file_) return;
  active_recorder.store(nullptr);
  file_->close_failed(reason.substr(0, reason.find('\n')));
  file_.reset();
}

}  // namespace scalestudy
