#include "bench/benchmarks.h"

#include <algorithm>
#include <memory>

#include "bench/bench_point.h"
#include "comm/mpi_runtime.h"
#include "control/mpi_check.h"

namespace scalestudy {
namespace {

constexpr const char* kPhase = "bench";

// The sum over ranks of (r + 1) for r < world_size.
float rank_sum(int world_size) { return static_cast<float>(world_size) * static_cast<float>(world_size + 1) / 2.0f; }

// A prime period, so that a chunk put in another rank's place differs from the one that
// belongs there (unless the chunks are multiples of 251 long).
constexpr size_t kPatternPeriod = 251;

float pattern(size_t index) { return static_cast<float>(1 + index % kPatternPeriod); }

// peers/bench_gpu_vs_torch.py reads the scope, median, algbw, busbw and wrong count.
void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  const std::string point =
      format_text("comm %s %s %lld bytes", t.text(row, "scope").c_str(), t.text(row, "collective").c_str(),
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
  Communicator& comm = *context.comm;
  for (size_t i = 0; i < host.size(); ++i) host[i] = comm_input(comm.rank(), i);
  context.backend.copy_from_host(buffers.send, host.data(), host.size());
  if (buffers.recv != buffers.send) context.backend.fill_zero(buffers.recv, buffers.recv_elems);
  buffers.run(comm);
  std::vector<float> result(buffers.recv_elems);
  context.backend.copy_to_host(result.data(), buffers.recv, result.size());
  int64_t wrong = static_cast<int64_t>(count_wrong_elems(kind, comm.rank(), comm.world_size(), buffers.payload, result));
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

// The node split of the job's ranks, and what every rank knows of it.
struct NodeLayout {
  NodeSplit split;
  int node_count = 1;
  int fewest_local_ranks = 1, most_local_ranks = 1;  // over the nodes
};

NodeLayout node_layout(MPI_Comm world) {
  NodeLayout layout;
  layout.split = split_by_node(world);
  const NodeRanks ranks = node_ranks(world);
  layout.node_count = ranks.node_count;
  CHECK_MPI(MPI_Allreduce(&ranks.local_size, &layout.fewest_local_ranks, 1, MPI_INT, MPI_MIN, world));
  CHECK_MPI(MPI_Allreduce(&ranks.local_size, &layout.most_local_ranks, 1, MPI_INT, MPI_MAX, world));
  return layout;
}

// One scope's communicator: what it is built over, and which ranks take part in its
// samples (their barriers, agreements and slowest times).
struct ScopePlan {
  std::string name;
  std::string absent_reason;              // not measured when set
  std::string description;                // what the file says of it when measured
  MPI_Comm participants = MPI_COMM_NULL;  // MPI_COMM_NULL where this rank sits it out
  MPI_Comm group = MPI_COMM_NULL;         // the ranks of this rank's communicator
  int ranks = 1;                          // of each communicator
  int groups = 1;                         // communicators that run at once
};

// Every rank plans every scope alike: the absences follow from the layout, which all know.
ScopePlan plan_scope(const std::string& name, const BenchContext& context, const NodeLayout& nodes) {
  ScopePlan scope;
  scope.name = name;
  if (name == "world") {
    scope.participants = scope.group = context.world;
    scope.ranks = context.world_size;
    scope.description = format_text("every rank: one communicator of %d rank(s)", scope.ranks);
  } else if (name == "intra_node") {
    if (nodes.fewest_local_ranks != nodes.most_local_ranks)
      scope.absent_reason = format_text("the nodes hold between %d and %d ranks: no one node-local size",
                                        nodes.fewest_local_ranks, nodes.most_local_ranks);
    else if (nodes.most_local_ranks == 1)
      scope.absent_reason = "one rank per node";
    scope.participants = context.world;
    scope.group = nodes.split.node;
    scope.ranks = nodes.most_local_ranks;
    scope.groups = nodes.node_count;
    scope.description = format_text("the ranks of each node: %d communicator(s) of %d rank(s), one per node, run at once",
                                    scope.groups, scope.ranks);
  } else {
    if (nodes.node_count == 1) scope.absent_reason = "one node";
    scope.participants = scope.group = nodes.split.leaders;
    scope.ranks = nodes.node_count;
    scope.description = format_text("each node's first rank: one communicator of %d rank(s), one per node; the "
                                    "other ranks wait",
                                    scope.ranks);
  }
  return scope;
}

// Every collective at every size over the scope's communicator, on a rank that takes part.
void measure_scope(BenchContext& context, const ScopePlan& scope) {
  std::unique_ptr<Communicator> owned;
  BenchContext scoped = context;
  scoped.world = scope.participants;
  CHECK_MPI(MPI_Comm_rank(scoped.world, &scoped.rank));
  CHECK_MPI(MPI_Comm_size(scoped.world, &scoped.world_size));
  if (scope.name != "world") {
    owned = context.make_group_comm(scope.group);
    scoped.comm = owned.get();
    if (context.tracer)
      if (void* stream = owned->native_stream()) context.tracer->name_stream("comm", stream);
  }
  const int ranks = scoped.comm->world_size();
  SCALESTUDY_CHECK(ranks == scope.ranks, "bench comm: a scope's communicator holds other ranks than planned");
  PointTable& table = context.table;
  for (const std::string& name : context.config.collectives) {
    const CollectiveKind kind = comm_collective_kind(name);
    for (int64_t bytes = context.config.min_bytes; bytes <= context.config.max_bytes; bytes *= 2) {
      const size_t elems = comm_payload_elems(bytes, ranks);
      const size_t row = table.add_row();
      table.set(row, "scope", scope.name);
      table.set(row, "ranks", ranks);
      table.set(row, "groups", scope.groups);
      table.set(row, "collective", name);
      table.set(row, "bytes", static_cast<int64_t>(elems * sizeof(float)));
      table.set(row, "elems", static_cast<int64_t>(elems));
      table.set(row, "bus_factor", bus_bandwidth_factor(kind, ranks));
      const size_t needed = predicted_bytes(kind, elems, ranks);
      if (!point_fits(scoped, {row}, needed, "needs " + std::to_string(needed) + " bytes per rank and head-room",
                      report))
        continue;
      CommBuffers buffers(context.backend, kind, elems, ranks);
      const int64_t wrong = check_point(scoped, buffers, kind);
      const TimedCalls timed = time_point(scoped, buffers, row);
      table.set_timing(row, timed);
      table.set(row, "wrong_elems", wrong);
      const double algbw = set_byte_rate(table, row, "algbw_gb_per_s");
      table.set(row, "busbw_gb_per_s", algbw * table.number(row, "bus_factor"));
      if (wrong > 0)
        table.set_status(row, PointStatus::wrong, std::to_string(wrong) + " result elements differ from the exact sums");
      report(scoped, row);
    }
  }
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
  PointTable& table = context.table;
  SCALESTUDY_CHECK(context.comm != nullptr, "bench comm needs a communicator");
  table.add_text("scope", "world, intra_node (the ranks of each node) or inter_node (one rank per node)");
  table.add_int("ranks", "ranks", "ranks of the communicator the collective ran over; n of the bus factor");
  table.add_int("groups", "", "communicators of this scope that ran at once (one per node for intra_node)");
  table.add_text("collective", "allreduce, reduce_scatter or allgather");
  table.add_int("bytes", "bytes", "payload: the full buffer the collective covers (nccl-tests' size)");
  table.add_int("elems", "elements", "fp32 elements of the payload; a multiple of ranks");
  add_byte_rate_column(table, "algbw_gb_per_s");
  table.add_float("bus_factor", "", "2(n-1)/n for allreduce, (n-1)/n for reduce_scatter and allgather; n = ranks");
  table.add_float("busbw_gb_per_s", "10^9 bytes/s", "algbw_gb_per_s · bus_factor");
  table.add_int("wrong_elems", "elements", "result elements, summed over ranks, that differ from the exact answer");

  auto& m = context.method;
  m["timing"] = context.timer_description() +
                "; each sample starts after a barrier of the scope's ranks, and is the slowest rank's";
  m["communicator"] = context.comm->name() +
                     ", through the start/finish pairs training uses (the hand-off "
                     "between the compute and comm streams, or to the MPI comm thread, included)";
  m["definitions"] = "algbw = bytes / time; busbw = algbw · 2(n-1)/n (allreduce), algbw · (n-1)/n "
                     "(reduce_scatter, allgather), n the scope's ranks; as nccl-tests defines them, "
                     "doc/PERFORMANCE.md of github.com/NVIDIA/nccl-tests";
  m["check"] = "before timing, one collective on inputs (r+1)·(1 + i mod 251), exact in fp32, compared bit for bit on "
               "every rank";
  m["world_size"] = std::to_string(context.world_size);

  NodeLayout nodes = node_layout(context.world);
  for (const std::string& name : context.config.comm_scopes) {
    const ScopePlan scope = plan_scope(name, context, nodes);
    m["scope_" + name] = scope.absent_reason.empty() ? scope.description : "absent: " + scope.absent_reason;
    if (!scope.absent_reason.empty()) {
      context.progress("comm " + name + ": absent (" + scope.absent_reason + ")");
      continue;
    }
    if (scope.participants != MPI_COMM_NULL) measure_scope(context, scope);
    // The ranks that sit a scope out (inter_node's) wait here for those that measure it; a
    // measuring rank's stuck collective ends the job through its communicator's watchdog.
    CHECK_MPI(MPI_Barrier(context.world));
  }
  m["scopes"] = join(context.config.comm_scopes, ",");
  free_node_split(nodes.split);
}

}  // namespace scalestudy
