#include "results/kernel_trace_writer.h"

#include <cmath>

#include "results/hdf5_check.h"
#include "results/hdf5_io.h"

namespace scalestudy {
namespace {

void write_rank(hid_t parent, int rank, const RankTrace& trace) {
  h5::Handle group = h5::create_group(parent, "rank_" + std::to_string(rank));
  const hid_t g = group.get();
  h5::set_attribute(g, "origin_ns", trace.origin_ns);
  h5::set_attribute(g, "device", trace.device);
  const size_t n = trace.records.size();
  std::vector<int64_t> step(n), start(n), end(n), bytes(n);
  std::vector<int32_t> name(n), stream(n), grid(3 * n), block(3 * n);
  std::vector<uint8_t> kind(n), category(n);
  for (size_t i = 0; i < n; ++i) {
    const TraceRecord& r = trace.records[i];
    step[i] = r.step;
    start[i] = r.start_ns;
    end[i] = r.end_ns;
    bytes[i] = r.bytes;
    name[i] = r.name;
    stream[i] = r.stream;
    kind[i] = static_cast<uint8_t>(r.kind);
    category[i] = static_cast<uint8_t>(r.category);
    for (size_t axis = 0; axis < 3; ++axis) {
      grid[3 * i + axis] = r.grid[axis];
      block[3 * i + axis] = r.block[axis];
    }
  }
  const std::vector<hsize_t> rows = {n}, triples = {n, 3};
  h5::write_array(g, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, rows, step.data());
  h5::write_array(g, "kind", H5T_STD_U8LE, H5T_NATIVE_UINT8, rows, kind.data());
  h5::write_array(g, "category", H5T_STD_U8LE, H5T_NATIVE_UINT8, rows, category.data());
  h5::write_array(g, "name", H5T_STD_I32LE, H5T_NATIVE_INT32, rows, name.data());
  h5::write_array(g, "stream", H5T_STD_I32LE, H5T_NATIVE_INT32, rows, stream.data());
  h5::write_array(g, "start_ns", H5T_STD_I64LE, H5T_NATIVE_INT64, rows, start.data());
  h5::write_array(g, "end_ns", H5T_STD_I64LE, H5T_NATIVE_INT64, rows, end.data());
  h5::write_array(g, "grid", H5T_STD_I32LE, H5T_NATIVE_INT32, triples, grid.data());
  h5::write_array(g, "block", H5T_STD_I32LE, H5T_NATIVE_INT32, triples, block.data());
  h5::write_array(g, "bytes", H5T_STD_I64LE, H5T_NATIVE_INT64, rows, bytes.data());
  for (const char* timed : {"start_ns", "end_ns"}) {
    h5::Handle dataset(CHECK_HDF5(H5Dopen2(g, timed, H5P_DEFAULT)));
    h5::set_attribute(dataset.get(), "units", "ns");
  }
  h5::Handle bytes_set(CHECK_HDF5(H5Dopen2(g, "bytes", H5P_DEFAULT)));
  h5::set_attribute(bytes_set.get(), "units", "bytes");
  h5::write_strings(g, "names", trace.names);
  h5::write_strings(g, "stream_names", trace.stream_names);
}

}  // namespace

void write_kernel_trace(hid_t file, const std::vector<RankTrace>& traces, const KernelTraceWindow& window) {
  h5::Handle group = h5::create_group(file, "kernel_trace");
  const hid_t g = group.get();
  h5::set_attribute(g, "category_names", kernel_category_names());
  h5::set_attribute(g, "kind_names", trace_record_kind_names());
  h5::set_attribute(g, "category_rules", kernel_category_rules());
  h5::set_attribute(g, "window_first", window.first);
  h5::set_attribute(g, "window_last", window.last);
  h5::set_attribute(g, "window_units", window.units);
  h5::set_attribute(g, "traced_step_time_mean_s", window.traced_step_time_mean_s);
  h5::set_attribute(g, "untraced_step_time_median_s", window.untraced_step_time_median_s);
  const double overhead = window.traced_step_time_mean_s / window.untraced_step_time_median_s - 1.0;
  h5::set_attribute(g, "tracing_overhead", std::isfinite(overhead) ? overhead : std::nan(""));
  h5::set_attribute(g, "clock",
                    "CUPTI activity timestamps (ns, CUPTI's host time base), per rank from that rank's origin_ns");
  for (size_t r = 0; r < traces.size(); ++r) write_rank(g, static_cast<int>(r), traces[r]);
}

}  // namespace scalestudy
