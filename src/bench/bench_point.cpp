#include "bench/bench_point.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>

#include "control/mpi_check.h"

namespace scalestudy {

void skip_point(BenchContext& context, const std::vector<size_t>& rows, PointStatus status,
                const std::string& detail, RowReport report) {
  for (size_t row : rows) {
    context.table.set_status(row, status, detail);
    report(context, row);
  }
}

bool point_fits(BenchContext& context, const std::vector<size_t>& rows, size_t predicted_bytes,
                const std::string& oom_detail, RowReport report) {
  int oom = memory_with_headroom(predicted_bytes) > available_memory_bytes(context.backend, context.config) ? 1 : 0;
  CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &oom, 1, MPI_INT, MPI_MAX, context.world));
  if (oom) skip_point(context, rows, PointStatus::oom, oom_detail, report);
  return oom == 0;
}

TimedCalls time_point_calls(BenchContext& context, const std::function<void()>& call, const TimingHooks& hooks) {
  const BenchConfig& c = context.config;
  std::unique_ptr<StepTimer> timer = context.backend.make_step_timer();
  return time_calls(*timer, call, c.warmup, c.repeats, c.min_sample_s, hooks);
}

TimedCalls time_row(BenchContext& context, size_t row, const std::function<void()>& call) {
  const TimedCalls timed = time_point_calls(context, call, context.trace_hooks(row));
  context.table.set_timing(row, timed);
  return timed;
}

TimedCalls time_flops_row(BenchContext& context, size_t row, const std::function<void()>& call) {
  const TimedCalls timed = time_row(context, row, call);
  set_flops_rate(context.table, row);
  return timed;
}

void set_flops_rate(PointTable& table, size_t row) {
  table.set(row, "tflops", table.number(row, "flops") / table.number(row, "time_median_s") / 1e12);
}

void add_work_columns(PointTable& table, const std::string& flops_description, const std::string& bytes_description) {
  table.add_float("flops", "FLOP", flops_description);
  table.add_float("bytes", "bytes", bytes_description);
  table.add_float("arithmetic_intensity", "FLOP/byte", "flops / bytes");
  table.add_float("tflops", "10^12 FLOP/s", "flops / time_median_s / 1e12");
}

void set_work(PointTable& table, size_t row, double flops, double bytes) {
  table.set(row, "flops", flops);
  table.set(row, "bytes", bytes);
  table.set(row, "arithmetic_intensity", flops / bytes);
}

void add_byte_rate_column(PointTable& table, const std::string& name) {
  table.add_float(name, "10^9 bytes/s", "bytes / time_median_s / 1e9");
}

double set_byte_rate(PointTable& table, size_t row, const std::string& name) {
  const double rate = static_cast<double>(table.integer(row, "bytes")) / table.number(row, "time_median_s") / 1e9;
  table.set(row, name, rate);
  return rate;
}

void add_memory_column(PointTable& table) {
  table.add_int("memory_bytes", "bytes", "bytes the point allocates, predicted before it runs");
}

std::string format_text(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list sizing;
  va_copy(sizing, args);
  const int length = std::vsnprintf(nullptr, 0, format, sizing);
  va_end(sizing);
  std::string text(static_cast<size_t>(std::max(length, 0)) + 1, '\0');
  std::vsnprintf(text.data(), text.size(), format, args);
  va_end(args);
  text.pop_back();
  return text;
}

void report_row(const BenchContext& context, size_t row, const std::string& point, const std::string& measured) {
  const PointTable& t = context.table;
  const PointStatus status = t.status(row);
  if (status == PointStatus::ok || status == PointStatus::wrong) {
    context.progress(point + ": " + measured);
  } else {
    context.progress(point + ": " + t.text(row, "status") + " (" + t.text(row, "detail") + ")");
  }
}

std::string time_text(const PointTable& table, size_t row, const char* label, const char* unit) {
  const double scale = std::strcmp(unit, "us") == 0 ? 1e6 : 1e3;
  return format_text("%s %.4g %s [IQR %.4g-%.4g]", label, table.number(row, "time_median_s") * scale, unit,
                     table.number(row, "time_q1_s") * scale, table.number(row, "time_q3_s") * scale);
}

}  // namespace scalestudy
