#include "bench/bench_comm.h"

#include <algorithm>

#include "bench/bench_point.h"
#include "core/check.h"

namespace scalestudy {
namespace {

constexpr const char* kPhase = "bench";

// The sum over ranks of (r + 1) for r < world_size.
float rank_sum(int world_size) { return static_cast<float>(world_size) * static_cast<float>(world_size + 1) / 2.0f; }

// A prime period, so that a chunk put in another rank's place differs from the one that
// belongs there (unless the chunks are multiples of 251 long).
constexpr size_t kPatternPeriod = 251;

float pattern(size_t index) { return static_cast<float>(1 + index % kPatternPeriod); }

// jobscripts/bench_gpu_vs_torch.py reads the median, algbw, busbw and wrong count.
void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  const std::string point = format_text("comm %s %lld bytes", t.text(row, "collective").c_str(),
                                        static_cast<long long>(t.integer(row, "bytes")));
  report_row(context, row, point,
             time_text(t, row, "median", "us") +
                 format_text(", algbw %.4g GB/s, busbw %.4g GB/s, %lld wrong", t.number(row, "algbw_gb_per_s"),
                             t.number(row, "busbw_gb_per_s"), static_cast<long long>(t.integer(row, "wrong_elems"))));
}

// The send and receive buffers of one collective at one size.
struct CommBuffers {
  CommBuffers(DeviceMemory& memory, CollectiveKind kind, size_t payload_elems, int world_size)
      : memory_(memory), kind_(kind) {
    payload = payload_elems;
    per_rank = payload_elems / static_cast<size_t>(world_size);
    send_elems = kind == CollectiveKind::allgather ? per_rank : payload_elems;
    recv_elems = kind == CollectiveKind::reduce_scatter ? per_rank : payload_elems;
    send = memory_.allocate_floats(send_elems, MemoryKind::communication);
    recv = kind == CollectiveKind::allreduce ? send : memory_.allocate_floats(recv_elems, MemoryKind::communication);
  }
  ~CommBuffers() {
    if (recv != send) memory_.release(recv);
    memory_.release(send);
  }
  CommBuffers(const CommBuffers&) = delete;
  CommBuffers& operator=(const CommBuffers&) = delete;

  // Starts the collective and waits for it (on the compute stream, on cuda).
  void run(Communicator& comm) {
    switch (kind_) {
      case CollectiveKind::allreduce: comm.finish(comm.start_allreduce(in_place(send, payload, kPhase))); return;
      case CollectiveKind::reduce_scatter:
        comm.finish(comm.start_reduce_scatter(collective_args(send, recv, per_rank, kPhase)));
        return;
      case CollectiveKind::allgather:
        comm.finish(comm.start_allgather(collective_args(send, recv, per_rank, kPhase)));
        return;
      default: SCALESTUDY_CHECK(false, "bench comm: unsupported collective");
    }
  }

  size_t payload = 0, per_rank = 0, send_elems = 0, recv_elems = 0;
  float* send = nullptr;
  float* recv = nullptr;

 private:
  DeviceMemory& memory_;
  CollectiveKind kind_;
};

size_t predicted_bytes(CollectiveKind kind, size_t payload_elems, int world_size) {
  const size_t per_rank = payload_elems / static_cast<size_t>(world_size);
  return (kind == CollectiveKind::allreduce ? payload_elems : payload_elems + per_rank) * sizeof(float);
}

// One untimed collective on the exact inputs; returns the wrong elements of all ranks.
int64_t check_point(BenchContext& context, CommBuffers& buffers, CollectiveKind kind) {
  std::vector<float> host(buffers.send_elems);
  for (size_t i = 0; i < host.size(); ++i) host[i] = comm_input(context.rank, i);
  context.backend.copy_from_host(buffers.send, host.data(), host.size());
  if (buffers.recv != buffers.send) context.backend.fill_zero(buffers.recv, buffers.recv_elems);
  buffers.run(*context.comm);
  std::vector<float> result(buffers.recv_elems);
  context.backend.copy_to_host(result.data(), buffers.recv, result.size());
  int64_t wrong = static_cast<int64_t>(count_wrong_elems(kind, context.rank, context.world_size, buffers.payload, result));
  int64_t total = 0;
  CHECK_MPI(MPI_Allreduce(&wrong, &total, 1, MPI_INT64_T, MPI_SUM, context.world));
  return total;
}

TimedCalls time_point(BenchContext& context, CommBuffers& buffers, size_t row) {
  Communicator& comm = *context.comm;
  context.backend.fill_zero(buffers.send, buffers.send_elems);
  if (buffers.recv != buffers.send) context.backend.fill_zero(buffers.recv, buffers.recv_elems);
  TimingHooks hooks = context.trace_hooks(row);
  // Every rank starts each sample together, with nothing of the last one still queued.
  hooks.before_sample = [&] {
    context.backend.synchronize();
    (void)comm.take_records();  // the records are not needed, only kept from growing
    CHECK_MPI(MPI_Barrier(context.world));
  };
  hooks.agree_calls = [&](int calls) {
    int agreed = calls;
    CHECK_MPI(MPI_Allreduce(&calls, &agreed, 1, MPI_INT, MPI_MAX, context.world));
    return agreed;
  };
  TimedCalls timed = time_point_calls(context, [&] { buffers.run(comm); }, hooks);
  context.backend.synchronize();
  (void)comm.take_records();
  std::vector<double> slowest(timed.samples_s.size());
  CHECK_MPI(MPI_Allreduce(timed.samples_s.data(), slowest.data(), static_cast<int>(slowest.size()), MPI_DOUBLE,
                          MPI_MAX, context.world));
  timed.samples_s = slowest;
  timed.stats = summarize_samples(slowest);
  return timed;
}

}  // namespace

CollectiveKind comm_collective_kind(const std::string& name) {
  if (name == "reduce_scatter") return CollectiveKind::reduce_scatter;
  if (name == "allgather") return CollectiveKind::allgather;
  return CollectiveKind::allreduce;
}

double bus_bandwidth_factor(CollectiveKind kind, int world_size) {
  const double n = world_size;
  switch (kind) {
    case CollectiveKind::allreduce: return 2.0 * (n - 1.0) / n;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::allgather: return (n - 1.0) / n;
    default: return 1.0;  // broadcast; a barrier moves no payload
  }
}

size_t comm_payload_elems(int64_t bytes, int world_size) {
  const size_t ranks = static_cast<size_t>(world_size);
  const size_t elems = static_cast<size_t>(bytes) / sizeof(float) / ranks * ranks;
  return std::max(elems, ranks);
}

float comm_input(int rank, size_t index) { return static_cast<float>(rank + 1) * pattern(index); }

size_t count_wrong_elems(CollectiveKind kind, int rank, int world_size, size_t payload_elems,
                         const std::vector<float>& result) {
  const size_t per_rank = payload_elems / static_cast<size_t>(world_size);
  size_t wrong = 0;
  for (size_t i = 0; i < result.size(); ++i) {
    float expected = 0.0f;
    if (kind == CollectiveKind::allreduce) expected = rank_sum(world_size) * pattern(i);
    if (kind == CollectiveKind::reduce_scatter)
      expected = rank_sum(world_size) * pattern(static_cast<size_t>(rank) * per_rank + i);
    if (kind == CollectiveKind::allgather) expected = comm_input(static_cast<int>(i / per_rank), i % per_rank);
    if (result[i] != expected) ++wrong;
  }
  const size_t expected_elems = kind == CollectiveKind::reduce_scatter ? per_rank : payload_elems;
  return wrong + (result.size() == expected_elems ? 0 : expected_elems);
}

void run_comm_bench(BenchContext& context) {
  const BenchConfig& config = context.config;
  PointTable& table = context.table;
  SCALESTUDY_CHECK(context.comm != nullptr, "bench comm needs a communicator");
  table.add_text("collective", "allreduce, reduce_scatter or allgather");
  table.add_int("bytes", "bytes", "payload: the full buffer the collective covers (nccl-tests' size)");
  table.add_int("elems", "elements", "fp32 elements of the payload; a multiple of the world size");
  add_byte_rate_column(table, "algbw_gb_per_s");
  table.add_float("bus_factor", "", "2(n-1)/n for allreduce, (n-1)/n for reduce_scatter and allgather");
  table.add_float("busbw_gb_per_s", "10^9 bytes/s", "algbw_gb_per_s · bus_factor");
  table.add_int("wrong_elems", "elements", "result elements, summed over ranks, that differ from the exact answer");

  auto& m = context.method;
  m["timing"] = context.timer_description() + "; each sample starts after a barrier, and is the slowest rank's";
  m["communicator"] = context.comm->name() +
                     ", through the start/finish pairs training uses (the hand-off "
                     "between the compute and comm streams, or to the MPI comm thread, included)";
  m["definitions"] = "algbw = bytes / time; busbw = algbw · 2(n-1)/n (allreduce), algbw · (n-1)/n "
                     "(reduce_scatter, allgather); as nccl-tests defines them, doc/PERFORMANCE.md of "
                     "github.com/NVIDIA/nccl-tests";
  m["check"] = "before timing, one collective on inputs (r+1)·(1 + i mod 251), exact in fp32, compared bit for bit on "
               "every rank";
  m["world_size"] = std::to_string(context.world_size);

  for (const std::string& name : config.collectives) {
    const CollectiveKind kind = comm_collective_kind(name);
    for (int64_t bytes = config.min_bytes; bytes <= config.max_bytes; bytes *= 2) {
      const size_t elems = comm_payload_elems(bytes, context.world_size);
      const size_t row = table.add_row();
      table.set(row, "collective", name);
      table.set(row, "bytes", static_cast<int64_t>(elems * sizeof(float)));
      table.set(row, "elems", static_cast<int64_t>(elems));
      table.set(row, "bus_factor", bus_bandwidth_factor(kind, context.world_size));
      const size_t needed = predicted_bytes(kind, elems, context.world_size);
      if (!point_fits(context, {row}, needed, "needs " + std::to_string(needed) + " bytes per rank and head-room",
                      report))
        continue;
      CommBuffers buffers(context.backend, kind, elems, context.world_size);
      const int64_t wrong = check_point(context, buffers, kind);
      const TimedCalls timed = time_point(context, buffers, row);
      table.set_timing(row, timed);
      table.set(row, "wrong_elems", wrong);
      const double algbw = set_byte_rate(table, row, "algbw_gb_per_s");
      table.set(row, "busbw_gb_per_s", algbw * table.number(row, "bus_factor"));
      if (wrong > 0)
        table.set_status(row, PointStatus::wrong, std::to_string(wrong) + " result elements differ from the exact sums");
      report(context, row);
    }
  }
}

}  // namespace scalestudy
