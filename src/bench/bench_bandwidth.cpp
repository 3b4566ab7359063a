#include "bench/benchmarks.h"

#include "bench/bench_gpt.h"
#include "bench/bench_point.h"
#include "core/check.h"
#include "profile/kernel_tag.h"

#if SCALESTUDY_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#include "elementwise.cuh"
#endif

namespace scalestudy {

double bandwidth_bytes_per_elem(const std::string& kernel) {
  return kernel == "accumulate" ? 3.0 * sizeof(float) : 2.0 * sizeof(float);
}

double bandwidth_flops_per_elem(const std::string& kernel) { return kernel == "accumulate" ? 1.0 : 0.0; }

namespace {

void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  const std::string point = "bandwidth " + t.text(row, "kernel") + " " + std::to_string(t.integer(row, "elems")) +
                            " elements";
  report_row(context, row, point,
             time_text(t, row, "median", "us") + format_text(", %.4g GB/s", t.number(row, "gb_per_s")));
}

// The call that one point times.
std::function<void()> kernel_call(BenchContext& context, const std::string& kernel, float* dst, const float* src,
                                  size_t elems) {
  Backend& backend = context.backend;
  if (kernel == "accumulate") return [&backend, dst, src, elems] { backend.accumulate(dst, src, elems); };
#if SCALESTUDY_HAVE_CUDA
  if (backend.name() == "cuda") {
    const cudaStream_t stream = dynamic_cast<CudaOps&>(backend).stream();
    return [stream, dst, src, elems] {
      ScopedKernelTag tag(KernelCategory::memory);
      cuda::launch_bench_copy(stream, dst, src, elems);
    };
  }
#endif
  return [&backend, dst, src, elems] { backend.copy(dst, src, elems); };
}

}  // namespace

void run_bandwidth_bench(BenchContext& context) {
  const BenchConfig& config = context.config;
  PointTable& table = context.table;
  table.add_text("kernel", "copy (dst = src) or accumulate (dst += src)");
  table.add_int("elems", "elements", "fp32 elements in each of the two buffers");
  table.add_int("bytes", "bytes", "bytes read plus bytes written by one call: 8 per element (copy), 12 (accumulate)");
  table.add_float("flops", "FLOP", "0 (copy) or 1 per element (accumulate)");
  table.add_float("arithmetic_intensity", "FLOP/byte", "flops / bytes");
  add_byte_rate_column(table, "gb_per_s");
  const bool cuda = context.backend.name() == "cuda";
  context.method["kernel_copy"] = cuda ? "float4 grid-stride copy, kernels/elementwise.cu" : "CpuOps::copy (memmove)";
  context.method["kernel_accumulate"] = cuda ? "CudaOps::accumulate" : "CpuOps::accumulate";
  context.method["byte_model"] = "bytes read plus bytes written, each element once: copy 8, accumulate 12 per element";
  context.method["flop_model"] = "accumulate: one add per element; copy: none";

  for (const std::string& kernel : kBandwidthKernels) {
    for (int64_t elems_signed : config.bandwidth_elems) {
      const size_t elems = static_cast<size_t>(elems_signed);
      const size_t row = table.add_row();
      table.set(row, "kernel", kernel);
      table.set(row, "elems", elems_signed);
      table.set(row, "bytes", static_cast<int64_t>(bandwidth_bytes_per_elem(kernel) * static_cast<double>(elems)));
      table.set(row, "flops", bandwidth_flops_per_elem(kernel) * static_cast<double>(elems));
      table.set(row, "arithmetic_intensity",
                bandwidth_flops_per_elem(kernel) / bandwidth_bytes_per_elem(kernel));
      const size_t needed = 2 * elems * sizeof(float);
      if (!point_fits(context, {row}, needed, "needs " + std::to_string(needed) + " bytes and head-room", report))
        continue;
      // MemoryKind::other: plain fp32 buffers on every backend, whatever its activations.
      float* src = allocate_random(context.backend, elems, MemoryKind::other, 21);
      float* dst = allocate_random(context.backend, elems, MemoryKind::other, 22);
      time_row(context, row, kernel_call(context, kernel, dst, src, elems));
      set_byte_rate(table, row, "gb_per_s");
      context.backend.release(src);
      context.backend.release(dst);
      report(context, row);
    }
  }
}

}  // namespace scalestudy
