#include "comm/nccl_communicator.h"

#if SCALESTUDY_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "comm/nccl_check.h"
#include "cuda_check.h"
#include "elementwise.cuh"

namespace scalestudy {
namespace {

std::string format_mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

double elapsed_s(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, from, to));
  return static_cast<double>(ms) * 1e-3;
}

}  // namespace

std::string NcclCommunicator::nccl_version() {
  int version = 0;
  CHECK_NCCL(ncclGetVersion(&version));
  // NCCL encodes major*10000 + minor*100 + patch since 2.9.
  return std::to_string(version / 10000) + "." + std::to_string((version / 100) % 100) + "." +
         std::to_string(version % 100);
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t compute_stream, double timeout_s,
                                   int overlapped_ctas)
    : timeout_s_(timeout_s), compute_stream_(compute_stream), overlapped_ctas_(overlapped_ctas) {
  CHECK_MPI(MPI_Comm_dup(comm, &mpi_comm_));
  CHECK_MPI(MPI_Comm_rank(mpi_comm_, &rank_));
  CHECK_MPI(MPI_Comm_size(mpi_comm_, &world_size_));
  ncclUniqueId id;
  if (rank_ == 0) CHECK_NCCL(ncclGetUniqueId(&id));
  CHECK_MPI(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_comm_));
  CHECK_NCCL(ncclCommInitRank(&nccl_, world_size_, id, rank_));
  if (overlapped_ctas > 0) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.maxCTAs = overlapped_ctas;
    config.cgaClusterSize = kOverlappedClusterCtas;
    CHECK_NCCL(ncclCommSplit(nccl_, 0, rank_, &overlapped_comm_, &config));
  }
  CHECK_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&marker_stream_, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMalloc(&device_barrier_, sizeof(int)));
  CHECK_CUDA(cudaMemset(device_barrier_, 0, sizeof(int)));
  epoch_ = take_event();
  CHECK_CUDA(cudaEventRecord(epoch_, compute_stream_));
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

NcclCommunicator::~NcclCommunicator() {
  finish_all();
  CHECK_CUDA(cudaStreamSynchronize(compute_stream_));
  stopping_ = true;
  watchdog_.join();
  for (cudaEvent_t event : all_events_) cudaEventDestroy(event);
  cudaFree(device_barrier_);
  cudaFree(wire_);
  if (overlapped_comm_) ncclCommDestroy(overlapped_comm_);
  cudaStreamDestroy(comm_stream_);
  cudaStreamDestroy(marker_stream_);
  ncclCommDestroy(nccl_);
  MPI_Comm_free(&mpi_comm_);
}

cudaEvent_t NcclCommunicator::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  cudaEvent_t event;
  CHECK_CUDA(cudaEventCreate(&event));
  all_events_.push_back(event);
  return event;
}

NcclCommunicator::InFlight& NcclCommunicator::find(uint64_t id) {
  for (InFlight& entry : in_flight_)
    if (entry.id == id) return entry;
  abort_job(__FILE__, __LINE__, "finish()", "collective #" + std::to_string(id) + " is not in flight");
}

template <typename Launch>
CommHandle NcclCommunicator::launch(CollectiveKind kind, const std::string& phase, size_t payload_bytes,
                                    Launch&& nccl_call) {
  InFlight entry;
  entry.id = ++last_id_;
  entry.kind = kind;
  entry.phase = phase;
  entry.payload_bytes = payload_bytes;
  entry.epoch = epoch_;
  entry.begin = take_event();
  entry.enqueued = take_event();
  entry.end = take_event();
  cudaEvent_t ready = take_event();
  // The hand-off: the comm stream starts only after everything compute has issued so far.
  CHECK_CUDA(cudaEventRecord(ready, compute_stream_));
  CHECK_CUDA(cudaStreamWaitEvent(comm_stream_, ready, 0));
  CHECK_CUDA(cudaEventRecord(entry.begin, comm_stream_));
  entry.started_at = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(entry);
  }
  // Recorded on the idle marker stream, the event passes at about the moment the host has
  // enqueued the collective's first operation: a call of several operations marks it
  // after the first; for one operation, the mark after the call is that moment.
  bool marked = false;
  const auto first_enqueued = [&] {
    if (!marked) CHECK_CUDA(cudaEventRecord(entry.enqueued, marker_stream_));
    marked = true;
  };
  nccl_call(first_enqueued);
  first_enqueued();
  CHECK_CUDA(cudaEventRecord(entry.end, comm_stream_));
  free_events_.push_back(ready);  // reusable once recorded: later waits use their own copy
  payload_bytes_by_kind_[static_cast<int>(kind)] += payload_bytes;
  return CommHandle{entry.id};
}

CommHandle NcclCommunicator::start_allreduce(float* buffer, size_t elems, const std::string& phase) {
  return launch(CollectiveKind::allreduce, phase, elems * sizeof(float), [&](const auto&) {
    CHECK_NCCL(ncclAllReduce(buffer, buffer, elems, ncclFloat, ncclSum, lane_comm(), comm_stream_));
  });
}

void* NcclCommunicator::wire_buffer(size_t elems) {
  if (elems > wire_elems_) {
    // The comm stream may still be reading the old buffer.
    CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
    CHECK_CUDA(cudaFree(wire_));
    CHECK_CUDA(cudaMalloc(&wire_, elems * 2));
    wire_elems_ = elems;
  }
  return wire_;
}

CommHandle NcclCommunicator::start_allreduce_in_bf16(float* buffer, size_t elems, const std::string& phase) {
  auto* wire = static_cast<__nv_bfloat16*>(wire_buffer(std::min(elems, kWirePieceElems)));
  return launch(CollectiveKind::allreduce, phase, elems * 2, [&](const auto& first_enqueued) {
    for (size_t offset = 0; offset < elems; offset += kWirePieceElems) {
      const size_t piece = std::min(kWirePieceElems, elems - offset);
      cuda::launch_cast(comm_stream_, wire, buffer + offset, piece);
      first_enqueued();
      CHECK_NCCL(ncclAllReduce(wire, wire, piece, ncclBfloat16, ncclSum, lane_comm(), comm_stream_));
      cuda::launch_cast(comm_stream_, buffer + offset, wire, piece);
    }
  });
}

CommHandle NcclCommunicator::start_reduce_scatter_in_bf16(const float* send, float* recv, size_t recv_elems,
                                                          const std::string& phase) {
  const size_t world = static_cast<size_t>(world_size_);
  const size_t piece_limit = std::min(recv_elems, kWirePieceElems);
  auto* wire = static_cast<__nv_bfloat16*>(wire_buffer(piece_limit * world));
  return launch(CollectiveKind::reduce_scatter, phase, recv_elems * world * 2, [&](const auto& first_enqueued) {
    for (size_t offset = 0; offset < recv_elems; offset += kWirePieceElems) {
      const size_t piece = std::min(kWirePieceElems, recv_elems - offset);
      // Piece `offset` of every rank's chunk, side by side as NCCL's send layout wants.
      for (size_t r = 0; r < world; ++r)
        cuda::launch_cast(comm_stream_, wire + r * piece, send + r * recv_elems + offset, piece);
      first_enqueued();
      __nv_bfloat16* own = wire + static_cast<size_t>(rank_) * piece;  // in place
      CHECK_NCCL(ncclReduceScatter(wire, own, piece, ncclBfloat16, ncclSum, lane_comm(), comm_stream_));
      cuda::launch_cast(comm_stream_, recv + offset, own, piece);
    }
  });
}

CommHandle NcclCommunicator::start_allreduce(double* host_buffer, size_t elems, const std::string& phase) {
  // The values and their sum are on the host, so MPI sums them there. Through NCCL they
  // took a copy to the device, a kernel and a synchronised copy back: about 0.25 ms between
  // zero2's gradient norm and its update (docs/performance-notes.md, change 28).
  SCALESTUDY_CHECK(elems <= static_cast<size_t>(std::numeric_limits<int>::max()),
                   "a host allreduce of " + std::to_string(elems) + " doubles is more than MPI counts");
  return launch(CollectiveKind::allreduce, phase, elems * sizeof(double), [&](const auto& first_enqueued) {
    MPI_Request request;
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, host_buffer, static_cast<int>(elems), MPI_DOUBLE, MPI_SUM, mpi_comm_,
                             &request));
    first_enqueued();
    const auto started = std::chrono::steady_clock::now();
    for (int done = 0; !done;) {
      CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (!done && waited >= timeout_s_) {
        std::lock_guard<std::mutex> lock(mutex_);
        abort_timed_out(find(last_id_));
      }
    }
  });
}

CommHandle NcclCommunicator::start_reduce_scatter(const float* send, float* recv, size_t recv_elems,
                                                  const std::string& phase) {
  return launch(CollectiveKind::reduce_scatter, phase, recv_elems * world_size_ * sizeof(float), [&](const auto&) {
    CHECK_NCCL(ncclReduceScatter(send, recv, recv_elems, ncclFloat, ncclSum, lane_comm(), comm_stream_));
  });
}

CommHandle NcclCommunicator::start_allgather(const float* send, float* recv, size_t send_elems,
                                             const std::string& phase) {
  return launch(CollectiveKind::allgather, phase, send_elems * world_size_ * sizeof(float), [&](const auto&) {
    CHECK_NCCL(ncclAllGather(send, recv, send_elems, ncclFloat, lane_comm(), comm_stream_));
  });
}

CommHandle NcclCommunicator::start_allgather_16bit(const uint16_t* send, uint16_t* recv, size_t send_elems,
                                                   const std::string& phase) {
  // A gather does no arithmetic, so any 16-bit type moves the words unchanged.
  return launch(CollectiveKind::allgather, phase, send_elems * world_size_ * sizeof(uint16_t), [&](const auto&) {
    CHECK_NCCL(ncclAllGather(send, recv, send_elems, ncclFloat16, lane_comm(), comm_stream_));
  });
}

CommHandle NcclCommunicator::start_broadcast(float* buffer, size_t elems, int root, const std::string& phase) {
  return launch(CollectiveKind::broadcast, phase, elems * sizeof(float), [&](const auto&) {
    CHECK_NCCL(ncclBroadcast(buffer, buffer, elems, ncclFloat, root, nccl_, comm_stream_));
  });
}

CommHandle NcclCommunicator::start_barrier(const std::string& phase) {
  return launch(CollectiveKind::barrier, phase, 0, [&](const auto&) {
    CHECK_NCCL(ncclAllReduce(device_barrier_, device_barrier_, 1, ncclInt, ncclSum, nccl_, comm_stream_));
  });
}

void NcclCommunicator::finish(CommHandle handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  InFlight& entry = find(handle.id);
  if (entry.finished) return;
  // Every collective runs on the comm stream, in the order started. Each wait of its own
  // would cost the GPU's front end a few microseconds while the collective after it waits
  // to start (docs/performance-notes.md, change 36).
  for (InFlight& earlier : in_flight_)
    if (earlier.id < handle.id) earlier.finished = true;
  entry.finished = true;
  entry.wait_begin = take_event();
  entry.wait_end = take_event();
  CHECK_CUDA(cudaEventRecord(entry.wait_begin, compute_stream_));
  CHECK_CUDA(cudaStreamWaitEvent(compute_stream_, entry.end, 0));
  CHECK_CUDA(cudaEventRecord(entry.wait_end, compute_stream_));
}

void NcclCommunicator::finish_all() {
  std::vector<uint64_t> open;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const InFlight& entry : in_flight_)
      if (!entry.finished) open.push_back(entry.id);
  }
  for (uint64_t id : open) finish(CommHandle{id});
}

void NcclCommunicator::set_epoch(std::chrono::steady_clock::time_point) {
  // A fresh event: collectives still in flight keep measuring from the origin of the
  // step that started them.
  std::lock_guard<std::mutex> lock(mutex_);
  const bool epoch_in_use = std::any_of(in_flight_.begin(), in_flight_.end(),
                                        [this](const InFlight& e) { return e.epoch == epoch_; });
  if (!epoch_in_use) free_events_.push_back(epoch_);
  epoch_ = take_event();
  CHECK_CUDA(cudaEventRecord(epoch_, compute_stream_));
}

std::vector<CollectiveRecord> NcclCommunicator::take_records() {
  std::vector<CollectiveRecord> records;
  std::lock_guard<std::mutex> lock(mutex_);
  while (!in_flight_.empty() && in_flight_.front().finished) {
    InFlight entry = in_flight_.front();
    const bool waited = entry.wait_end != nullptr;
    CHECK_CUDA(cudaEventSynchronize(waited ? entry.wait_end : entry.end));
    CollectiveRecord record;
    record.kind = entry.kind;
    record.phase = entry.phase;
    record.payload_bytes = entry.payload_bytes;
    record.end_s = elapsed_s(entry.epoch, entry.end);
    // The comm stream passes `begin` once compute has handed over; when it was idle, that
    // can be before the host had enqueued the collective, so the later of the two counts.
    record.begin_s = std::min(record.end_s, std::max(elapsed_s(entry.epoch, entry.begin),
                                                     elapsed_s(entry.epoch, entry.enqueued)));
    if (waited) {
      record.wait_begin_s = elapsed_s(entry.epoch, entry.wait_begin);
      record.wait_end_s = elapsed_s(entry.epoch, entry.wait_end);
    }
    records.push_back(record);
    in_flight_.pop_front();
    for (cudaEvent_t event : {entry.begin, entry.enqueued, entry.end, entry.wait_begin, entry.wait_end})
      if (event) free_events_.push_back(event);
    if (entry.epoch != epoch_ && std::none_of(in_flight_.begin(), in_flight_.end(),
                                              [&](const InFlight& e) { return e.epoch == entry.epoch; }) &&
        std::find(free_events_.begin(), free_events_.end(), entry.epoch) == free_events_.end())
      free_events_.push_back(entry.epoch);
  }
  return records;
}

std::vector<size_t> NcclCommunicator::payload_bytes_by_kind() const {
  return std::vector<size_t>(payload_bytes_by_kind_.begin(), payload_bytes_by_kind_.end());
}

void NcclCommunicator::watchdog_loop() {
  while (!stopping_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (ncclComm_t comm : {nccl_, overlapped_comm_}) {
      ncclResult_t async_error = ncclSuccess;
      if (comm && ncclCommGetAsyncError(comm, &async_error) == ncclSuccess && async_error != ncclSuccess &&
          async_error != ncclInProgress) {
        abort_job(__FILE__, __LINE__, "NCCL asynchronous error",
                  std::string(ncclGetErrorString(async_error)) + " on rank " + std::to_string(rank_));
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    for (const InFlight& entry : in_flight_) {
      if (cudaEventQuery(entry.end) != cudaErrorNotReady) continue;
      const double waited = std::chrono::duration<double>(now - entry.started_at).count();
      if (waited < timeout_s_) continue;
      abort_timed_out(entry);
    }
  }
}

void NcclCommunicator::abort_timed_out(const InFlight& entry) {
  // Every communicator the watchdog watches, so that none leaves a kernel spinning.
  for (ncclComm_t comm : {nccl_, overlapped_comm_})
    if (comm) ncclCommAbort(comm);
  abort_job(__FILE__, __LINE__, "collective timed out",
            std::string("collective ") + collective_kind_name(entry.kind) + " #" + std::to_string(entry.id) +
                " (phase " + entry.phase + ", " + format_mib(entry.payload_bytes) + ") did not finish within " +
                std::to_string(static_cast<int>(timeout_s_)) + " s on rank " + std::to_string(rank_) +
                " -- a peer may have died or be stuck");
}

}  // namespace scalestudy
#endif
