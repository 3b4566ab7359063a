#include "comm/mpi_communicator.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <utility>

#include "core/bf16_host.h"
#include "control/mpi_check.h"

namespace scalestudy {

// What MPI moves for a wire type: bf16 travels as its bits, in MPI_UINT16_T.
struct MpiElement {
  MPI_Datatype type = MPI_FLOAT;
  size_t bytes = sizeof(float);
};

// What a queued collective needs of the communicator, copied so that the comm stream
// never reads the communicator's members.
struct MpiCall {
  MPI_Comm comm = MPI_COMM_NULL;
  int world_size = 1;
  int rank = 0;
  size_t max_piece_elems = 0;
  MpiElement element;
  MPI_Op op = MPI_SUM;

  // The element `elems` elements on from base.
  char* at(void* base, size_t elems) const { return static_cast<char*>(base) + elems * element.bytes; }
  const char* at(const void* base, size_t elems) const {
    return static_cast<const char*>(base) + elems * element.bytes;
  }
};

namespace {

MpiElement mpi_element(WireType wire) {
  switch (wire) {
    case WireType::f64: return {MPI_DOUBLE, sizeof(double)};
    case WireType::bf16_from_f32:
    case WireType::u16: return {MPI_UINT16_T, sizeof(uint16_t)};
    case WireType::f32: break;
  }
  return {MPI_FLOAT, sizeof(float)};
}

// Calls body(offset_elems, piece_elems) over [0, elems) in pieces that fit an MPI int count.
template <class Body>
void for_each_piece(size_t elems, size_t max_piece_elems, Body body) {
  for (size_t offset_elems = 0; offset_elems < elems; offset_elems += max_piece_elems) {
    body(offset_elems, static_cast<int>(std::min(max_piece_elems, elems - offset_elems)));
  }
}

void allreduce_in_pieces(const MpiCall& call, void* buffer, size_t elems) {
  for_each_piece(elems, call.max_piece_elems, [&](size_t offset_elems, int piece_elems) {
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, call.at(buffer, offset_elems), piece_elems, call.element.type, call.op,
                            call.comm));
  });
}

// Rank `rank` receives the sum of chunk `rank` of every rank's send ([world][recv_elems]).
void reduce_scatter_in_pieces(const MpiCall& call, const void* send, void* recv, size_t recv_elems) {
  if (recv_elems <= call.max_piece_elems) {
    CHECK_MPI(MPI_Reduce_scatter_block(send, recv, static_cast<int>(recv_elems), call.element.type, call.op,
                                       call.comm));
    return;
  }
  // A piece of every rank's chunk is strided in send, which MPI_Reduce_scatter_block
  // cannot express without a derived datatype, and predefined reductions are only
  // guaranteed on predefined types. One reduce per owner keeps every buffer contiguous;
  // at these sizes the extra calls cost nothing measurable.
  for_each_piece(recv_elems, call.max_piece_elems, [&](size_t offset_elems, int piece_elems) {
    for (int owner = 0; owner < call.world_size; ++owner) {
      const char* chunk = call.at(send, static_cast<size_t>(owner) * recv_elems + offset_elems);
      CHECK_MPI(MPI_Reduce(chunk, owner == call.rank ? call.at(recv, offset_elems) : nullptr, piece_elems,
                           call.element.type, call.op, owner, call.comm));
    }
  });
}

// Chunk r of recv ([world][send_elems]) from rank r; in place when send is this rank's chunk.
void allgather_in_pieces(const MpiCall& call, const void* send, void* recv, size_t send_elems) {
  char* own_chunk = call.at(recv, static_cast<size_t>(call.rank) * send_elems);
  const bool in_place = send == own_chunk;
  if (send_elems <= call.max_piece_elems) {
    const int count = static_cast<int>(send_elems);
    CHECK_MPI(MPI_Allgather(in_place ? MPI_IN_PLACE : send, count, call.element.type, recv, count, call.element.type,
                            call.comm));
    return;
  }
  // Chunks larger than an int count: each owner broadcasts its chunk piece by piece,
  // which keeps every buffer contiguous (see reduce_scatter above).
  if (!in_place) std::memcpy(own_chunk, send, send_elems * call.element.bytes);
  for_each_piece(send_elems, call.max_piece_elems, [&](size_t offset_elems, int piece_elems) {
    for (int owner = 0; owner < call.world_size; ++owner) {
      char* chunk = call.at(recv, static_cast<size_t>(owner) * send_elems + offset_elems);
      CHECK_MPI(MPI_Bcast(chunk, piece_elems, call.element.type, owner, call.comm));
    }
  });
}

void broadcast_in_pieces(const MpiCall& call, void* buffer, size_t elems, int root) {
  for_each_piece(elems, call.max_piece_elems, [&](size_t offset_elems, int piece_elems) {
    CHECK_MPI(MPI_Bcast(call.at(buffer, offset_elems), piece_elems, call.element.type, root, call.comm));
  });
}

// The sum of one MPI step over bf16 bits: each addition in fp32, rounded to bf16 (NCCL's
// bf16 sum).
void bf16_sum(void* in, void* inout, int* elems, MPI_Datatype* /*type*/) {
  const auto* addend = static_cast<const uint16_t*>(in);
  auto* sum = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *elems; ++i)
    sum[i] = bf16_bits_from_float(float_from_bf16_bits(addend[i]) + float_from_bf16_bits(sum[i]));
}

std::vector<uint16_t> to_bf16_bits(const float* values, size_t elems) {
  std::vector<uint16_t> bits(elems);
  for (size_t i = 0; i < elems; ++i) bits[i] = bf16_bits_from_float(values[i]);
  return bits;
}

void from_bf16_bits(float* values, const std::vector<uint16_t>& bits) {
  for (size_t i = 0; i < bits.size(); ++i) values[i] = float_from_bf16_bits(bits[i]);
}

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  CHECK_MPI(MPI_Comm_dup(comm, &copy));
  return copy;
}

int rank_in(MPI_Comm comm) {
  int rank = 0;
  CHECK_MPI(MPI_Comm_rank(comm, &rank));
  return rank;
}

int size_of(MPI_Comm comm) {
  int size = 1;
  CHECK_MPI(MPI_Comm_size(comm, &size));
  return size;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s)
    : comm_(duplicate(comm)), rank_(rank_in(comm_)), world_size_(size_of(comm_)), watchdog_(rank_, timeout_s) {
  CHECK_MPI(MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_));
  epoch_ = Clock::now();
  worker_ = std::thread(&MpiCommunicator::worker_loop, this);
}

MpiCommunicator::~MpiCommunicator() {
  // Buffers the queued collectives write into may be owned by whoever destroys us, so
  // nothing may still be running once the destructor returns.
  finish_all();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  worker_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    CHECK_MPI(MPI_Op_free(&bf16_sum_));
    CHECK_MPI(MPI_Comm_free(&comm_));
  }
}

void MpiCommunicator::set_max_elems_per_call(size_t elems) {
  SCALESTUDY_CHECK(elems >= 1 && elems <= static_cast<size_t>(INT_MAX),
                   "max elements per MPI call must lie in [1, INT_MAX], got " + std::to_string(elems));
  max_elems_per_call_ = elems;
}

double MpiCommunicator::seconds_since_epoch(Clock::time_point when) const {
  return std::chrono::duration<double>(when - epoch_).count();
}

CommHandle MpiCommunicator::enqueue(CollectiveKind kind, const CollectiveArgs& args, std::function<void()> run) {
  check_collective_args(kind, args, world_size_, rank_);
  Pending pending{{++last_started_id_, kind, args.phase, payload_bytes(kind, args, world_size_)}, std::move(run)};
  const uint64_t id = pending.collective.id;
  watchdog_.watch(pending.collective);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(pending));
  }
  work_ready_.notify_one();
  return CommHandle{id};
}

void MpiCommunicator::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // Drains the queue before stopping, so that no rank skips a collective its peers run.
    work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Pending running = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();

    const Clock::time_point begin = Clock::now();
    try {
      running.run();
    } catch (const std::bad_alloc&) {
      // The bf16 forms' host copies: the job ends as on any rank that runs out of memory.
      end_job("out of memory while allocating communication (the bf16 staging of a collective, on the comm stream)",
              1);
    } catch (const std::exception& error) {
      abort_job(__FILE__, __LINE__, "collective on the comm stream threw", error.what());
    }
    const Clock::time_point end = Clock::now();
    const StartedCollective& done = running.collective;
    watchdog_.forget(done.id);

    lock.lock();
    payload_bytes_by_kind_[static_cast<size_t>(done.kind)] += done.payload_bytes;
    finished_.push_back(FinishedStamp{done, begin, end});
    finished_through_ = done.id;
    work_done_.notify_all();
  }
}

MpiCall MpiCommunicator::call_for(WireType wire, MPI_Op op) const {
  return MpiCall{comm_, world_size_, rank_, max_elems_per_call_, mpi_element(wire), op};
}

CommHandle MpiCommunicator::start_allreduce(const CollectiveArgs& args) {
  if (args.wire == WireType::bf16_from_f32) return start_bf16_allreduce(args);
  const MpiCall call = call_for(args.wire, MPI_SUM);
  void* buffer = args.recv;
  const size_t elems = args.elems;
  return enqueue(CollectiveKind::allreduce, args, [=] { allreduce_in_pieces(call, buffer, elems); });
}

CommHandle MpiCommunicator::start_bf16_allreduce(const CollectiveArgs& args) {
  const MpiCall call = call_for(args.wire, bf16_sum_);
  auto* buffer = static_cast<float*>(args.recv);
  const size_t elems = args.elems;
  note_staging(staging_bytes_for(CollectiveKind::allreduce, elems, args.wire));
  return enqueue(CollectiveKind::allreduce, args, [=] {
    std::vector<uint16_t> wire = to_bf16_bits(buffer, elems);
    allreduce_in_pieces(call, wire.data(), elems);
    from_bf16_bits(buffer, wire);
  });
}

CommHandle MpiCommunicator::start_reduce_scatter(const CollectiveArgs& args) {
  if (args.wire == WireType::bf16_from_f32) return start_bf16_reduce_scatter(args);
  const MpiCall call = call_for(args.wire, MPI_SUM);
  const void* send = args.send;
  void* recv = args.recv;
  const size_t recv_elems = args.elems;
  return enqueue(CollectiveKind::reduce_scatter, args,
                 [=] { reduce_scatter_in_pieces(call, send, recv, recv_elems); });
}

CommHandle MpiCommunicator::start_bf16_reduce_scatter(const CollectiveArgs& args) {
  const MpiCall call = call_for(args.wire, bf16_sum_);
  const auto* send = static_cast<const float*>(args.send);
  auto* recv = static_cast<float*>(args.recv);
  const size_t recv_elems = args.elems, send_elems = recv_elems * static_cast<size_t>(world_size_);
  note_staging(staging_bytes_for(CollectiveKind::reduce_scatter, recv_elems, args.wire));
  return enqueue(CollectiveKind::reduce_scatter, args, [=] {
    const std::vector<uint16_t> wire_send = to_bf16_bits(send, send_elems);
    std::vector<uint16_t> wire_recv(recv_elems);
    reduce_scatter_in_pieces(call, wire_send.data(), wire_recv.data(), recv_elems);
    from_bf16_bits(recv, wire_recv);
  });
}

CommHandle MpiCommunicator::start_allgather(const CollectiveArgs& args) {
  const MpiCall call = call_for(args.wire, MPI_SUM);
  const void* send = args.send;
  void* recv = args.recv;
  const size_t send_elems = args.elems;
  return enqueue(CollectiveKind::allgather, args, [=] { allgather_in_pieces(call, send, recv, send_elems); });
}

CommHandle MpiCommunicator::start_broadcast(const CollectiveArgs& args, int root) {
  check_broadcast_root(root, world_size_, args.phase);
  const MpiCall call = call_for(args.wire, MPI_SUM);
  void* buffer = args.recv;
  const size_t elems = args.elems;
  return enqueue(CollectiveKind::broadcast, args, [=] { broadcast_in_pieces(call, buffer, elems, root); });
}

CommHandle MpiCommunicator::start_barrier(const std::string& phase) {
  MPI_Comm comm = comm_;
  CollectiveArgs args;
  args.phase = phase;
  return enqueue(CollectiveKind::barrier, args, [=] { CHECK_MPI(MPI_Barrier(comm)); });
}

size_t MpiCommunicator::staging_bytes_for(CollectiveKind kind, size_t elems, WireType wire) const {
  if (wire != WireType::bf16_from_f32) return 0;
  if (kind == CollectiveKind::allreduce) return elems * sizeof(uint16_t);
  if (kind == CollectiveKind::reduce_scatter) return (elems * static_cast<size_t>(world_size_) + elems) * sizeof(uint16_t);
  return 0;
}

void MpiCommunicator::note_staging(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  staging_bytes_ = std::max(staging_bytes_, bytes);
}

void MpiCommunicator::finish(CommHandle handle) {
  SCALESTUDY_CHECK(handle.id >= 1 && handle.id <= last_started_id_,
                   "finish() got collective #" + std::to_string(handle.id) +
                       ", which this communicator never started");
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_through_ >= handle.id) return;
  const Clock::time_point wait_begin = Clock::now();
  // No deadline here: the watchdog ends the job for a collective that never finishes.
  work_done_.wait(lock, [&] { return finished_through_ >= handle.id; });
  waits_[handle.id] = {wait_begin, Clock::now()};
}

void MpiCommunicator::finish_all() {
  if (last_started_id_ > 0) finish(CommHandle{last_started_id_});
}

std::vector<CollectiveRecord> MpiCommunicator::take_records() {
  std::vector<FinishedStamp> stamps;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stamps.swap(finished_);
  }
  std::vector<CollectiveRecord> records;
  records.reserve(stamps.size());
  for (const FinishedStamp& stamp : stamps) {
    CollectiveRecord record = record_of(stamp.collective);
    record.begin_s = seconds_since_epoch(stamp.begin);
    record.end_s = seconds_since_epoch(stamp.end);
    if (auto wait = waits_.find(stamp.collective.id); wait != waits_.end()) {
      record.wait_begin_s = seconds_since_epoch(wait->second.first);
      record.wait_end_s = seconds_since_epoch(wait->second.second);
      waits_.erase(wait);
    }
    records.push_back(std::move(record));
  }
  return records;
}

size_t MpiCommunicator::staging_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return staging_bytes_;
}

std::vector<size_t> MpiCommunicator::payload_bytes_by_kind() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::vector<size_t>(payload_bytes_by_kind_.begin(), payload_bytes_by_kind_.end());
}

}  // namespace scalestudy
