#pragma once
// Writes the gathered kernel traces of --profile-kernels as /kernel_trace
// (docs/results-schema.md), into a run file or a benchmark file.
#include <hdf5.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "profile/kernel_trace.h"

namespace scalestudy {

struct KernelTraceWindow {
  int64_t first = 0, last = 0;
  std::string units = "step";  // "step" (runs) or "point" (benchmarks)
  double traced_step_time_mean_s = std::numeric_limits<double>::quiet_NaN();
  double untraced_step_time_median_s = std::numeric_limits<double>::quiet_NaN();
};

// traces[r] is rank r's.
void write_kernel_trace(hid_t file, const std::vector<RankTrace>& traces, const KernelTraceWindow& window);

}  // namespace scalestudy
