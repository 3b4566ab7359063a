#pragma once
// The steps every benchmark takes for one point: its rows are filled with what the models
// predict, the point is skipped (oom, unavailable) or timed into its rows, and each row
// gets a progress line. The loops over the points stay in the benchmarks, which know what
// a point is.
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_common.h"

namespace scalestudy {

// Prints the progress line of a row; each benchmark has its own, built with report_row.
using RowReport = void (*)(BenchContext& context, size_t row);

// Marks the rows of a point that is not run with `status` and `detail`, and reports them.
void skip_point(BenchContext& context, const std::vector<size_t>& rows, PointStatus status,
                const std::string& detail, RowReport report);

// Whether a point that allocates `predicted_bytes` on each rank fits, with head-room, in
// what every rank has available. All ranks get the same answer, so that they take the same
// branch (or the others would wait in a collective). A point that does not fit is skipped
// as oom with `oom_detail`.
bool point_fits(BenchContext& context, const std::vector<size_t>& rows, size_t predicted_bytes,
                const std::string& oom_detail, RowReport report);

// Times `call` with the config's warm-up, repeats and sample length, on a step timer the
// backend makes for it (time_calls).
TimedCalls time_point_calls(BenchContext& context, const std::function<void()>& call, const TimingHooks& hooks);

// Times `call` for `row` (the tracer's window where one runs) and sets the row's timing.
TimedCalls time_row(BenchContext& context, size_t row, const std::function<void()>& call);

// The row's rate "tflops" from its "flops" and its median time.
void set_flops_rate(PointTable& table, size_t row);

// time_row, then set_flops_rate; returns the timing.
TimedCalls time_flops_row(BenchContext& context, size_t row, const std::function<void()>& call);

// The columns of what one call does by the benchmark's models, and its rate: flops, bytes
// (both as doubles), arithmetic_intensity = flops / bytes, and tflops (time_flops_row).
void add_work_columns(PointTable& table, const std::string& flops_description, const std::string& bytes_description);
void set_work(PointTable& table, size_t row, double flops, double bytes);

// A rate column `name` [10^9 bytes/s] = bytes / time_median_s / 1e9, from the integer
// column bytes; set_byte_rate sets it for a timed row and returns it.
void add_byte_rate_column(PointTable& table, const std::string& name);
double set_byte_rate(PointTable& table, size_t row, const std::string& name);

// The column memory_bytes: what a point allocates, predicted before it runs.
void add_memory_column(PointTable& table);

// printf into a string.
std::string format_text(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Prints a row's progress line: "<point>: <measured>" for a point that ran (ok, or with
// wrong results), "<point>: <status> (<detail>)" for one that did not.
void report_row(const BenchContext& context, size_t row, const std::string& point, const std::string& measured);

// "<label> <median> <unit> [IQR <q1>-<q3>]": a row's time per call, in "ms" or "us".
std::string time_text(const PointTable& table, size_t row, const char* label, const char* unit);

}  // namespace scalestudy
