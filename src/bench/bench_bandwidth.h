#pragma once
// `scalestudy bench bandwidth`: GB/s of elementwise kernels over fp32 buffers, from 16K to
// 64M elements by default. Two kernels on each backend:
//   copy:       dst = src          8 bytes per element (read 4, write 4), no FLOPs
//               cuda: a float4 grid-stride kernel (kernels/elementwise.cu);
//               cpu: the backend's copy (memmove)
//   accumulate: dst += src         12 bytes per element (read 8, write 4), 1 FLOP
//               the backend's accumulate, as backward's residual gradients use it
// GB/s = bytes / median time / 1e9, counting bytes read plus bytes written.
#include <cstddef>
#include <string>
#include <vector>

#include "bench/bench_common.h"

namespace scalestudy {

inline const std::vector<std::string> kBandwidthKernels = {"copy", "accumulate"};

// Bytes read plus written per element, and FLOPs per element, of a kernel.
double bandwidth_bytes_per_elem(const std::string& kernel);
double bandwidth_flops_per_elem(const std::string& kernel);

void run_bandwidth_bench(BenchContext& context);

}  // namespace scalestudy
