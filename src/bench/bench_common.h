#pragma once
// What every `scalestudy bench <name>` shares: the validated options, the timing helper
// (warm-up excluded, median and IQR over repeats), the table of measured points, the
// memory check that marks a point OOM before it is attempted, and the HDF5 file that
// holds the points (docs/results-schema.md, "Benchmark files").
//
// The backends abort the job when an allocation fails (a half-allocated model is no state
// to continue from), so a point that would not fit is recognised beforehand: the point's
// allocations are predicted from the same shapes the code allocates, and compared with
// the memory the device (or host) reports free.
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "config/backend_config.h"
#include "core/memory_estimate.h"
#include "core/model_shape.h"
#include "core/precision.h"
#include "results/output_lock.h"
#include "results/run_recorder.h"
#include "timing/step_timer.h"

namespace scalestudy {

enum class BenchKind { gemm, bandwidth, layer, inference, comm };
inline constexpr int kBenchKindCount = 5;
const char* bench_kind_name(BenchKind kind);
// Throws UsageError naming the benchmark when it is unknown.
BenchKind parse_bench_kind(const std::string& name);

// Every option of every benchmark, resolved (backend-dependent defaults filled in) and
// validated by the bench command. Each benchmark reads only its own fields.
struct BenchConfig {
  BenchKind kind = BenchKind::gemm;
  std::string backend = "cpu";  // cpu | cuda
  std::string output;           // HDF5 file; empty = print only
  bool overwrite = false;       // an existing file at output may be replaced
  int warmup = 2;               // samples run and discarded before the timed ones (>= 1)
  int repeats = 10;             // timed samples per point
  double min_sample_s = 1e-3;   // a sample repeats the call until it lasts about this long
  double comm_timeout_s = 300.0;
  size_t memory_limit_bytes = 0;  // 0: only what the device (host) reports available

  std::vector<int64_t> gemm_sizes;         // n of the square n×n×n GEMMs
  std::vector<std::string> precisions;     // fp32, tf32, fp16, bf16
  std::vector<int64_t> bandwidth_elems;    // fp32 elements per buffer

  Precision precision = Precision::fp32;   // what layer / inference compute in
  AttentionKernel attention_kernel = AttentionKernel::auto_select;  // layer / inference, cuda bf16/fp16
  std::string model;                       // preset of layer / inference
  ModelShape shape;                        // resolved: preset, overrides, max_seq
  std::vector<int> batches, seqs;          // the grid of layer / inference

  std::vector<std::string> collectives;    // allreduce, reduce_scatter, allgather
  std::vector<std::string> comm_scopes = {"world", "intra_node", "inter_node"};  // benchmarks.h
  int64_t min_bytes = 0, max_bytes = 0;    // payload range of comm, doubling
  std::string link_emulation = "none";     // comm on cuda: none | socket (comm/nccl_transport.h)

  bool profile_kernels = false;            // trace one extra sample per point (cuda)

  // The backend these options ask for, as RunConfig::backend_config() gives train's.
  // The GEMM choice and the training-only settings keep BackendConfig's defaults.
  BackendConfig backend_config() const {
    BackendConfig config;
    config.backend = backend;
    config.precision = precision;
    config.attention_kernel = attention_kernel;
    config.comm_timeout_s = comm_timeout_s;
    config.link_emulation = link_emulation;
    return config;
  }
};

// ---- parsing helpers (shared with the command line, tested on their own) --------------

// "128,512,2048", with K/M/G suffixes (powers of 1024) and "A..B" for the powers of two
// times A up to B ("16K..64M"). Every value must be positive. Throws UsageError naming
// "--<option> <text>".
std::vector<int64_t> parse_size_list(const std::string& option, const std::string& text);
// One size with an optional K/M/G suffix.
int64_t parse_size(const std::string& option, const std::string& text);
// Comma-separated names, each one of `allowed`.
std::vector<std::string> parse_name_list(const std::string& option, const std::string& text,
                                         const std::vector<std::string>& allowed);
std::string join(const std::vector<std::string>& parts, const std::string& separator);

// ---- timing ---------------------------------------------------------------------------

// Median and quartiles, interpolated between order statistics (numpy's default, as the
// run summary does).
struct SampleStats {
  double median_s = 0.0, q1_s = 0.0, q3_s = 0.0;
  double iqr_s() const { return q3_s - q1_s; }
};
SampleStats summarize_samples(const std::vector<double>& samples_s);

struct TimedCalls {
  int calls_per_sample = 1;
  std::vector<double> samples_s;  // seconds per call, one per timed sample
  SampleStats stats;
};

struct TimingHooks {
  // Runs before every sample, outside its timed span (e.g. synchronise and barrier).
  std::function<void()> before_sample;
  // Given this rank's choice of calls per sample, returns the one every rank uses.
  std::function<int(int)> agree_calls;
  // --profile-kernels: one more sample of the same calls runs after the timed ones,
  // untimed, with the tracer recording; its records are labelled trace_label.
  KernelTracer* tracer = nullptr;
  int64_t trace_label = 0;
};

// Times `call` on the timer's stream. `warmup` samples run first and are discarded; each
// one sets how many calls the next sample makes (so that a sample lasts at least
// min_sample_s), from the time per call it measured. Then `repeats` samples are timed;
// each holds calls_per_sample back-to-back calls between two marks, and reports their
// time divided by the count. warmup >= 1 and repeats >= 1. With hooks.tracer, one traced
// sample follows, untimed, so tracing changes no timing.
TimedCalls time_calls(StepTimer& timer, const std::function<void()>& call, int warmup, int repeats,
                      double min_sample_s, const TimingHooks& hooks = {});

// Calls per sample for a call that took `seconds_per_call`: enough to last min_sample_s,
// at least 1 and at most kMaxCallsPerSample.
inline constexpr int kMaxCallsPerSample = 10000;
int calls_for(double seconds_per_call, double min_sample_s);

// ---- memory ---------------------------------------------------------------------------

// Bytes that may be allocated now (DeviceMemory::available_bytes: free device memory on
// cuda, MemAvailable on the cpu); never more than config.memory_limit_bytes when that is
// set. A point's prediction is compared with it after memory_with_headroom
// (core/memory_estimate.h), since the backend's scratch, cuBLAS's workspaces and the
// allocator's rounding are not in the prediction.
size_t available_memory_bytes(const Backend& backend, const BenchConfig& config);

// ---- the table of points --------------------------------------------------------------

enum class PointStatus { ok, oom, unavailable, wrong };
inline constexpr int kPointStatusCount = 4;
const char* point_status_name(PointStatus status);

// One row per point, in measurement order. Every table has the common columns (status,
// detail, timing) and the benchmark adds its own; each column becomes a 1-D dataset of
// the bench group, with its units and description as attributes.
class PointTable {
 public:
  explicit PointTable(int repeats);

  void add_float(const std::string& name, const std::string& units, const std::string& description);
  void add_int(const std::string& name, const std::string& units, const std::string& description);
  void add_text(const std::string& name, const std::string& description);

  // A new row: NaN, 0 and "" until set; status ok.
  size_t add_row();
  void set(size_t row, const std::string& name, double value);
  void set(size_t row, const std::string& name, int64_t value);
  void set(size_t row, const std::string& name, int value) { set(row, name, static_cast<int64_t>(value)); }
  void set(size_t row, const std::string& name, const std::string& value);
  void set(size_t row, const std::string& name, const char* value) { set(row, name, std::string(value)); }
  void set_status(size_t row, PointStatus status, const std::string& detail);
  void set_timing(size_t row, const TimedCalls& timed);

  size_t rows() const { return status_.size(); }
  PointStatus status(size_t row) const { return status_[row]; }
  double number(size_t row, const std::string& name) const;
  int64_t integer(size_t row, const std::string& name) const;
  const std::string& text(size_t row, const std::string& name) const;
  // The row's timed samples, seconds per call (NaN until set_timing).
  const std::vector<double>& samples_s(size_t row) const { return samples_s_.at(row); }

  // Writes every column into `group` (and samples_s as [points, repeats]).
  void write(hid_t group) const;
  // A plain-text table of the named columns; NaN shows as "-".
  std::string render(const std::vector<std::string>& columns) const;

 private:
  enum class Type { number, integer, text };
  struct Column {
    Type type = Type::number;
    std::string units, description;
    std::vector<double> numbers;
    std::vector<int64_t> integers;
    std::vector<std::string> texts;
  };
  Column& column(const std::string& name, Type type);
  const Column& column(const std::string& name) const;
  void add_column(const std::string& name, Type type, const std::string& units, const std::string& description);

  int repeats_;
  std::vector<std::string> order_;
  std::map<std::string, Column> columns_;
  std::vector<PointStatus> status_;
  std::vector<std::vector<double>> samples_s_;
};

// ---- what a benchmark runs with -------------------------------------------------------

struct BenchContext {
  const BenchConfig& config;
  Backend& backend;
  Communicator* comm = nullptr;  // comm only
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, world_size = 1;
  PointTable& table;
  // Attributes of the bench group that describe the method (timing, FLOP and byte models).
  std::map<std::string, std::string>& method;
  // Prints one progress line (rank 0 only).
  void progress(const std::string& line) const;
  // Timing where the backend computes: CUDA events on the compute stream, or the host's
  // steady clock.
  std::string timer_description() const;
  // --profile-kernels: the tracer, or nullptr.
  KernelTracer* tracer = nullptr;
  // comm only: a communicator of the job's backend (MPI or NCCL) over a group of ranks,
  // built by every rank of the group.
  std::function<std::unique_ptr<Communicator>(MPI_Comm group)> make_group_comm = nullptr;
  // Timing hooks that trace the point in `row` when there is a tracer.
  TimingHooks trace_hooks(size_t row) const {
    TimingHooks hooks;
    hooks.tracer = tracer;
    hooks.trace_label = static_cast<int64_t>(row);
    return hooks;
  }
};

// Writes the model into a group's method attributes as /config does: its preset name as
// model, then layers, hidden, heads, vocab, max_seq and attention, every value a string.
void describe_model(std::map<std::string, std::string>& method, const std::string& model, const ModelShape& shape);
// describe_model for a bench that runs the model, and how it computes: the precision and
// the attention kernels used.
void describe_model_run(std::map<std::string, std::string>& method, const BenchConfig& config,
                        const ModelShape& shape);

// ---- the file -------------------------------------------------------------------------

// A benchmark's HDF5 file, written by rank 0: created as "<output>.partial" with the
// provenance attributes and status "running" when the benchmark starts, completed with
// the points and renamed to <output> when it ends. An abort (a CUDA error, a stuck
// collective) marks it failed, with the points measured so far. Construction, which
// takes the output's lock (results/output_lock.h) and throws UsageError on every rank
// where another run holds it, is collective over `world`.
class BenchFile {
 public:
  BenchFile(const OutputPathCheck& output, BenchKind kind, const RunIdentity& identity,
            const std::string& precision, MPI_Comm world);
  ~BenchFile();
  BenchFile(const BenchFile&) = delete;
  BenchFile& operator=(const BenchFile&) = delete;

  // The table and method the abort hook writes if the job ends early.
  void watch(const PointTable* table, const std::map<std::string, std::string>* method);
  // Writes the points and marks the file "complete" once it reads back whole
  // (results/complete_mark.h), or "failed" when reason is not empty. Returns the reason the
  // file is failed: failure_reason, or on rank 0 why it could not be marked complete.
  std::string finish(const std::string& failure_reason);
  // Rank 0: writes the gathered kernel traces as /kernel_trace, before finish().
  void write_kernel_trace(const std::vector<RankTrace>& traces, int64_t last_point);
  const std::string& output() const { return output_; }

 private:
  std::string write_and_close(const std::string& status, const std::string& reason);
  std::unique_ptr<OutputLock> lock_;  // rank 0's, until the file has its final name
  std::string output_, partial_;
  BenchKind kind_;
  int rank_ = 0;
  hid_t file_ = -1;
  const PointTable* table_ = nullptr;
  const std::map<std::string, std::string>* method_ = nullptr;
};

}  // namespace scalestudy
