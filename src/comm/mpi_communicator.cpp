#include "comm/mpi_communicator.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <iterator>
#include <utility>

#include "core/bf16_host.h"
#include "core/check.h"

namespace scalestudy {
namespace {

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}
template <>
MPI_Datatype mpi_type<uint16_t>() {
  return MPI_UINT16_T;
}

// Calls body(offset_elems, piece_elems) over [0, elems) in pieces that fit an MPI int count.
template <class Body>
void for_each_piece(size_t elems, size_t max_piece_elems, Body body) {
  for (size_t offset_elems = 0; offset_elems < elems; offset_elems += max_piece_elems) {
    body(offset_elems, static_cast<int>(std::min(max_piece_elems, elems - offset_elems)));
  }
}

bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

std::string format_bytes(size_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

std::string format_seconds(double seconds) {
  char text[64];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

void check_buffer(const void* buffer, size_t elems, const char* what) {
  SCALESTUDY_CHECK(buffer != nullptr || elems == 0,
                   std::string(what) + " is null but holds " + std::to_string(elems) + " elements");
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

template <class T>
void allreduce_in_pieces(MPI_Comm comm, T* buffer, size_t elems, size_t max_piece_elems,
                         MPI_Datatype type, MPI_Op op) {
  for_each_piece(elems, max_piece_elems, [&](size_t offset_elems, int piece_elems) {
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, buffer + offset_elems, piece_elems, type, op, comm));
  });
}

template <class T>
void allreduce_in_pieces(MPI_Comm comm, T* buffer, size_t elems, size_t max_piece_elems) {
  allreduce_in_pieces(comm, buffer, elems, max_piece_elems, mpi_type<T>(), MPI_SUM);
}

// Rank `rank` receives the sum of chunk `rank` of every rank's send ([world][recv_elems]).
template <class T>
void reduce_scatter_in_pieces(MPI_Comm comm, int world_size, int rank, const T* send, T* recv,
                              size_t recv_elems, size_t max_piece_elems, MPI_Datatype type,
                              MPI_Op op) {
  if (recv_elems <= max_piece_elems) {
    CHECK_MPI(MPI_Reduce_scatter_block(send, recv, static_cast<int>(recv_elems), type, op, comm));
    return;
  }
  // A piece of every rank's chunk is strided in send, which MPI_Reduce_scatter_block
  // cannot express without a derived datatype, and predefined reductions are only
  // guaranteed on predefined types. One reduce per owner keeps every buffer contiguous;
  // at these sizes the extra calls cost nothing measurable.
  for_each_piece(recv_elems, max_piece_elems, [&](size_t offset_elems, int piece_elems) {
    for (int owner = 0; owner < world_size; ++owner) {
      const T* chunk = send + static_cast<size_t>(owner) * recv_elems + offset_elems;
      CHECK_MPI(MPI_Reduce(chunk, owner == rank ? recv + offset_elems : nullptr, piece_elems, type,
                           op, owner, comm));
    }
  });
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) : timeout_s_(timeout_s) {
  SCALESTUDY_CHECK(timeout_s > 0.0, "the collective timeout must be a positive number of seconds, got " +
                                        std::to_string(timeout_s));
  CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  CHECK_MPI(MPI_Comm_size(comm_, &world_size_));
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

CommHandle MpiCommunicator::enqueue(CollectiveKind kind, const std::string& phase,
                                    size_t payload_bytes, std::function<void()> run) {
  Pending pending;
  pending.id = ++last_started_id_;
  pending.kind = kind;
  pending.phase = phase;
  pending.payload_bytes = payload_bytes;
  pending.run = std::move(run);
  const uint64_t id = pending.id;
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
    std::function<void()> run = std::move(queue_.front().run);
    front_running_ = true;
    lock.unlock();

    const Clock::time_point begin = Clock::now();
    try {
      run();
    } catch (const std::exception& error) {
      abort_job(__FILE__, __LINE__, "collective on the comm stream threw", error.what());
    }
    const Clock::time_point end = Clock::now();

    lock.lock();
    Pending& done = queue_.front();
    payload_bytes_by_kind_[static_cast<size_t>(done.kind)] += done.payload_bytes;
    finished_.push_back(FinishedStamp{done.id, done.kind, std::move(done.phase), done.payload_bytes, begin, end});
    finished_through_ = done.id;
    queue_.pop_front();
    front_running_ = false;
    work_done_.notify_all();
  }
}

CommHandle MpiCommunicator::start_allreduce(float* buffer, size_t elems, const std::string& phase) {
  check_buffer(buffer, elems, "allreduce buffer");
  MPI_Comm comm = comm_;
  const size_t max_piece_elems = max_elems_per_call_;
  return enqueue(CollectiveKind::allreduce, phase, elems * sizeof(float),
                 [=] { allreduce_in_pieces(comm, buffer, elems, max_piece_elems); });
}

CommHandle MpiCommunicator::start_allreduce(double* buffer, size_t elems, const std::string& phase) {
  check_buffer(buffer, elems, "allreduce buffer");
  MPI_Comm comm = comm_;
  const size_t max_piece_elems = max_elems_per_call_;
  return enqueue(CollectiveKind::allreduce, phase, elems * sizeof(double),
                 [=] { allreduce_in_pieces(comm, buffer, elems, max_piece_elems); });
}

CommHandle MpiCommunicator::start_reduce_scatter(const float* send, float* recv, size_t recv_elems,
                                                 const std::string& phase) {
  const size_t send_elems = recv_elems * static_cast<size_t>(world_size_);
  check_buffer(send, send_elems, "reduce_scatter send buffer");
  check_buffer(recv, recv_elems, "reduce_scatter recv buffer");
  // MPI forbids aliasing here, and MPI_IN_PLACE would mean a different buffer layout.
  SCALESTUDY_CHECK(!ranges_overlap(send, send_elems * sizeof(float), recv, recv_elems * sizeof(float)),
                   "reduce_scatter: the recv buffer overlaps the send buffer (phase " + phase + ")");
  MPI_Comm comm = comm_;
  const int world_size = world_size_;
  const int rank = rank_;
  const size_t max_piece_elems = max_elems_per_call_;
  return enqueue(CollectiveKind::reduce_scatter, phase, send_elems * sizeof(float), [=] {
    reduce_scatter_in_pieces(comm, world_size, rank, send, recv, recv_elems, max_piece_elems,
                             MPI_FLOAT, MPI_SUM);
  });
}

CommHandle MpiCommunicator::start_allreduce_in_bf16(float* buffer, size_t elems,
                                                    const std::string& phase) {
  check_buffer(buffer, elems, "allreduce buffer");
  MPI_Comm comm = comm_;
  MPI_Op op = bf16_sum_;
  const size_t max_piece_elems = max_elems_per_call_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    staging_bytes_ = std::max(staging_bytes_, elems * sizeof(uint16_t));
  }
  return enqueue(CollectiveKind::allreduce, phase, elems * sizeof(uint16_t), [=] {
    std::vector<uint16_t> wire = to_bf16_bits(buffer, elems);
    allreduce_in_pieces(comm, wire.data(), elems, max_piece_elems, MPI_UINT16_T, op);
    from_bf16_bits(buffer, wire);
  });
}

CommHandle MpiCommunicator::start_reduce_scatter_in_bf16(const float* send, float* recv,
                                                         size_t recv_elems,
                                                         const std::string& phase) {
  const size_t send_elems = recv_elems * static_cast<size_t>(world_size_);
  check_buffer(send, send_elems, "reduce_scatter send buffer");
  check_buffer(recv, recv_elems, "reduce_scatter recv buffer");
  MPI_Comm comm = comm_;
  MPI_Op op = bf16_sum_;
  const int world_size = world_size_;
  const int rank = rank_;
  const size_t max_piece_elems = max_elems_per_call_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    staging_bytes_ = std::max(staging_bytes_, (send_elems + recv_elems) * sizeof(uint16_t));
  }
  return enqueue(CollectiveKind::reduce_scatter, phase, send_elems * sizeof(uint16_t), [=] {
    const std::vector<uint16_t> wire_send = to_bf16_bits(send, send_elems);
    std::vector<uint16_t> wire_recv(recv_elems);
    reduce_scatter_in_pieces(comm, world_size, rank, wire_send.data(), wire_recv.data(), recv_elems,
                             max_piece_elems, MPI_UINT16_T, op);
    from_bf16_bits(recv, wire_recv);
  });
}

CommHandle MpiCommunicator::start_allgather(const float* send, float* recv, size_t send_elems,
                                            const std::string& phase) {
  return start_allgather_of(send, recv, send_elems, phase);
}

CommHandle MpiCommunicator::start_allgather_16bit(const uint16_t* send, uint16_t* recv, size_t send_elems,
                                                  const std::string& phase) {
  return start_allgather_of(send, recv, send_elems, phase);
}

template <class T>
CommHandle MpiCommunicator::start_allgather_of(const T* send, T* recv, size_t send_elems,
                                               const std::string& phase) {
  const size_t recv_elems = send_elems * static_cast<size_t>(world_size_);
  check_buffer(send, send_elems, "allgather send buffer");
  check_buffer(recv, recv_elems, "allgather recv buffer");
  T* own_chunk = recv + static_cast<size_t>(rank_) * send_elems;
  const bool in_place = send == own_chunk;
  SCALESTUDY_CHECK(in_place || !ranges_overlap(send, send_elems * sizeof(T), recv, recv_elems * sizeof(T)),
                   "allgather: the send buffer overlaps the recv buffer but is not this rank's "
                   "chunk of it (phase " + phase + ")");
  MPI_Comm comm = comm_;
  const int world_size = world_size_;
  const size_t max_piece_elems = max_elems_per_call_;
  return enqueue(CollectiveKind::allgather, phase, recv_elems * sizeof(T), [=] {
    const MPI_Datatype type = mpi_type<T>();
    if (send_elems <= max_piece_elems) {
      const int count = static_cast<int>(send_elems);
      CHECK_MPI(MPI_Allgather(in_place ? MPI_IN_PLACE : send, count, type, recv, count, type, comm));
      return;
    }
    // Chunks larger than an int count: each owner broadcasts its chunk piece by piece,
    // which keeps every buffer contiguous (see reduce_scatter above).
    if (!in_place) std::copy(send, send + send_elems, own_chunk);
    for_each_piece(send_elems, max_piece_elems, [&](size_t offset_elems, int piece_elems) {
      for (int owner = 0; owner < world_size; ++owner) {
        T* chunk = recv + static_cast<size_t>(owner) * send_elems + offset_elems;
        CHECK_MPI(MPI_Bcast(chunk, piece_elems, type, owner, comm));
      }
    });
  });
}

CommHandle MpiCommunicator::start_broadcast(float* buffer, size_t elems, int root,
                                            const std::string& phase) {
  check_buffer(buffer, elems, "broadcast buffer");
  SCALESTUDY_CHECK(root >= 0 && root < world_size_,
                   "broadcast root " + std::to_string(root) + " is not a rank of this " +
                       std::to_string(world_size_) + "-rank communicator (phase " + phase + ")");
  MPI_Comm comm = comm_;
  const size_t max_piece_elems = max_elems_per_call_;
  return enqueue(CollectiveKind::broadcast, phase, elems * sizeof(float), [=] {
    for_each_piece(elems, max_piece_elems, [&](size_t offset_elems, int piece_elems) {
      CHECK_MPI(MPI_Bcast(buffer + offset_elems, piece_elems, MPI_FLOAT, root, comm));
    });
  });
}

CommHandle MpiCommunicator::start_barrier(const std::string& phase) {
  MPI_Comm comm = comm_;
  return enqueue(CollectiveKind::barrier, phase, 0, [=] { CHECK_MPI(MPI_Barrier(comm)); });
}

void MpiCommunicator::finish(CommHandle handle) {
  SCALESTUDY_CHECK(handle.id >= 1 && handle.id <= last_started_id_,
                   "finish() got collective #" + std::to_string(handle.id) +
                       ", which this communicator never started");
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_through_ >= handle.id) return;
  const Clock::time_point wait_begin = Clock::now();
  // Capped so that a huge timeout cannot overflow the clock's integer representation.
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(timeout_s_, 1.0e9)));
  const bool finished = work_done_.wait_until(lock, Clock::now() + timeout, [&] {
    return finished_through_ >= handle.id;
  });
  if (!finished) abort_on_timeout(handle.id);
  waits_[handle.id] = {wait_begin, Clock::now()};
}

void MpiCommunicator::finish_all() {
  if (last_started_id_ > 0) finish(CommHandle{last_started_id_});
}

// Called with mutex_ held. Names the collective at the head of the comm stream, not
// necessarily the one waited for: in FIFO order the head is the one that is stuck.
void MpiCommunicator::abort_on_timeout(uint64_t waited_id) {
  const Pending& stuck = queue_.front();
  std::string detail = std::string("collective ") + collective_kind_name(stuck.kind) + " #" +
                       std::to_string(stuck.id) + " (phase " + stuck.phase + ", " +
                       format_bytes(stuck.payload_bytes) + ") did not finish within " +
                       format_seconds(timeout_s_) + " on rank " + std::to_string(rank_) +
                       " -- a peer may have died or be stuck";
  if (!front_running_) detail += " (the comm stream had not even started it)";
  if (stuck.id != waited_id) {
    detail += "; finish() was waiting for #" + std::to_string(waited_id) + ", queued behind it";
  }
  abort_job(__FILE__, __LINE__, "collective timed out", detail);
}

std::vector<CollectiveRecord> MpiCommunicator::take_records() {
  std::vector<FinishedStamp> stamps;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stamps.swap(finished_);
  }
  std::vector<CollectiveRecord> records;
  records.reserve(stamps.size());
  for (FinishedStamp& stamp : stamps) {
    CollectiveRecord record;
    record.kind = stamp.kind;
    record.phase = std::move(stamp.phase);
    record.payload_bytes = stamp.payload_bytes;
    record.begin_s = seconds_since_epoch(stamp.begin);
    record.end_s = seconds_since_epoch(stamp.end);
    if (auto wait = waits_.find(stamp.id); wait != waits_.end()) {
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
