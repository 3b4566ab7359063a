#pragma once
// The kernel profile of --profile-kernels: every kernel, memcpy and memset a rank's GPU ran
// inside the traced window, with its category (kernel_category.h), and the tracer that
// records them. The CUDA backend implements the tracer with CUPTI (loaded only when a
// tracer is made); docs/results-schema.md "/kernel_trace" describes the stored form.
#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "profile/kernel_category.h"

namespace scalestudy {

struct TraceRecord {
  int64_t step = 0;  // the step (runs) or point (benchmarks) the record belongs to
  int64_t start_ns = 0, end_ns = 0;  // from the rank's origin_ns
  int64_t bytes = 0;                 // copies and sets; 0 for kernels
  int32_t name = 0;                  // index into RankTrace::names
  int32_t stream = 0;                // index into RankTrace::stream_names
  std::array<int32_t, 3> grid{}, block{};
  TraceRecordKind kind = TraceRecordKind::kernel;
  KernelCategory category = KernelCategory::other;
};
// Records travel between ranks as bytes.
static_assert(std::is_trivially_copyable_v<TraceRecord>);

struct RankTrace {
  std::string device;
  int64_t origin_ns = 0;  // the tracer's clock when it first started
  std::vector<std::string> names, stream_names;
  std::vector<TraceRecord> records;  // sorted by start_ns
};

class KernelTracer {
 public:
  virtual ~KernelTracer() = default;
  // Names a stream that scalestudy owns ("compute", "comm"); native_stream is the
  // backend's stream handle (cudaStream_t).
  virtual void name_stream(const std::string& name, void* native_stream) = 0;
  // Starts recording. Work queued before start() may still appear, in the next collect().
  virtual void start() = 0;
  // Takes every record completed so far and labels it with `step`. The caller has waited
  // for the GPU work it wants included (the step or sample synchronised).
  virtual void collect(int64_t step) = 0;
  // Stops recording; collect() afterwards takes what was still in flight.
  virtual void stop() = 0;
  // The records collected so far, sorted; the tracer keeps none.
  virtual RankTrace take_trace() = 0;
};

// Every rank's trace on rank 0, in rank order (the others get an empty vector).
// Collective over comm.
std::vector<RankTrace> gather_traces(MPI_Comm comm, const RankTrace& mine);

}  // namespace scalestudy
