#include "bench/bench_bandwidth.h"

#include <cstdio>
#include <memory>

#include "bench/bench_gpt.h"
#include "core/check.h"
#include "profile/kernel_tag.h"

#if SCALESTUDY_HAVE_CUDA
#include "backend/cuda/cuda_ops.h"
#include "bench_bandwidth.cuh"
#endif

namespace scalestudy {

double bandwidth_bytes_per_elem(const std::string& kernel) {
  return kernel == "accumulate" ? 3.0 * sizeof(float) : 2.0 * sizeof(float);
}

double bandwidth_flops_per_elem(const std::string& kernel) { return kernel == "accumulate" ? 1.0 : 0.0; }

namespace {

void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  char line[256];
  const std::string point = "bandwidth " + t.text(row, "kernel") + " " + std::to_string(t.integer(row, "elems")) +
                            " elements";
  if (t.status(row) != PointStatus::ok) {
    std::snprintf(line, sizeof(line), "%s: %s (%s)", point.c_str(), t.text(row, "status").c_str(),
                  t.text(row, "detail").c_str());
  } else {
    std::snprintf(line, sizeof(line), "%s: median %.4g us [IQR %.4g-%.4g], %.4g GB/s", point.c_str(),
                  t.number(row, "time_median_s") * 1e6, t.number(row, "time_q1_s") * 1e6,
                  t.number(row, "time_q3_s") * 1e6, t.number(row, "gb_per_s"));
  }
  context.progress(line);
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
  table.add_float("gb_per_s", "10^9 bytes/s", "bytes / time_median_s / 1e9");
  const bool cuda = context.backend.name() == "cuda";
  context.method["timing"] = context.timer_description();
  context.method["kernel_copy"] = cuda ? "float4 grid-stride copy, kernels/bench_bandwidth.cu" : "CpuOps::copy (memmove)";
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
      if (memory_with_headroom(needed) > available_memory_bytes(context.backend, config)) {
        table.set_status(row, PointStatus::oom, "needs " + std::to_string(needed) + " bytes and head-room");
        report(context, row);
        continue;
      }
      // MemoryKind::other: plain fp32 buffers on every backend, whatever its activations.
      float* src = allocate_random(context.backend, elems, MemoryKind::other, 21);
      float* dst = allocate_random(context.backend, elems, MemoryKind::other, 22);
      std::unique_ptr<StepTimer> timer = context.backend.make_step_timer();
      const TimedCalls timed = time_calls(*timer, kernel_call(context, kernel, dst, src, elems), config.warmup,
                                          config.repeats, config.min_sample_s, context.trace_hooks(row));
      table.set_timing(row, timed);
      table.set(row, "gb_per_s", static_cast<double>(table.integer(row, "bytes")) / timed.stats.median_s / 1e9);
      context.backend.release(src);
      context.backend.release(dst);
      report(context, row);
    }
  }
}

}  // namespace scalestudy
