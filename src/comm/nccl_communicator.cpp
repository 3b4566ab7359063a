#include "comm/nccl_communicator.h"

#if SCALESTUDY_HAVE_CUDA
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>

#include "comm/nccl_check.h"
#include "comm/nccl_transport.h"
#include "cuda_check.h"
#include "control/mpi_check.h"

namespace scalestudy {
namespace {

double elapsed_s(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, from, to));
  return static_cast<double>(ms) * 1e-3;
}

// The NCCL type of a device collective's elements. A gather or broadcast does no
// arithmetic, so 16-bit words move unchanged as any 16-bit type.
ncclDataType_t nccl_type(WireType wire) { return wire == WireType::u16 ? ncclFloat16 : ncclFloat; }

}  // namespace

std::string NcclCommunicator::nccl_version() {
  int version = 0;
  CHECK_NCCL(ncclGetVersion(&version));
  // NCCL encodes major*10000 + minor*100 + patch since 2.9.
  return std::to_string(version / 10000) + "." + std::to_string((version / 100) % 100) + "." +
         std::to_string(version % 100);
}

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t compute_stream, double timeout_s, int overlapped_ctas)
    : overlapped_ctas_(overlapped_ctas),
      compute_stream_(compute_stream),
      comm_stream_([] {
        cudaStream_t stream = nullptr;
        CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        return stream;
      }()),
      wire_(comm_stream_) {
  CHECK_MPI(MPI_Comm_dup(comm, &mpi_comm_));
  CHECK_MPI(MPI_Comm_rank(mpi_comm_, &rank_));
  CHECK_MPI(MPI_Comm_size(mpi_comm_, &world_size_));
  // Before NCCL's first call in this process, which reads its log settings once.
  NcclLog& log = NcclLog::instance();
  log_offset_ = log.size();
  nccl_environment_ = environment_with_prefix("NCCL_");
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
  CHECK_CUDA(cudaStreamCreateWithFlags(&marker_stream_, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMalloc(&device_barrier_, sizeof(int)));
  CHECK_CUDA(cudaMemset(device_barrier_, 0, sizeof(int)));
  measure_transports(log_offset_);
  epoch_ = take_event();
  CHECK_CUDA(cudaEventRecord(epoch_, compute_stream_));
  CollectiveWatchdog::Hooks hooks;
  hooks.before_check = [this] { check_async_errors(); };
  hooks.on_timeout = [this](const std::string& message) { abort_timed_out(message); };
  watchdog_ = std::make_unique<CollectiveWatchdog>(rank_, timeout_s, std::move(hooks));
}

NcclCommunicator::~NcclCommunicator() {
  finish_all();
  CHECK_CUDA(cudaStreamSynchronize(compute_stream_));
  forward_nccl_warnings();
  watchdog_.reset();  // before the communicators it checks go
  for (cudaEvent_t event : all_events_) cudaEventDestroy(event);
  cudaFree(device_barrier_);
  if (overlapped_comm_) ncclCommDestroy(overlapped_comm_);
  cudaStreamDestroy(marker_stream_);
  ncclCommDestroy(nccl_);
  // The staging buffer is freed after this body; freeing memory needs no stream.
  cudaStreamDestroy(comm_stream_);
  MPI_Comm_free(&mpi_comm_);
}

void NcclCommunicator::measure_transports(size_t log_offset) {
  if (world_size_ > 1) {
    for (ncclComm_t comm : {nccl_, overlapped_comm_})
      if (comm) CHECK_NCCL(ncclAllReduce(device_barrier_, device_barrier_, 1, ncclInt, ncclSum, comm, comm_stream_));
    CHECK_CUDA(cudaStreamSynchronize(comm_stream_));
  }
  NcclLog& log = NcclLog::instance();
  if (!log.capturing()) {
    transports_unknown_why_ = log.why_not();
    return;
  }
  const std::string mine = log.read_from(log_offset);
  if (mine.empty()) {
    // NCCL opened its log before the capture was set up (an earlier NCCL call in this
    // process), so its lines went elsewhere.
    transports_unknown_why_ = "NCCL wrote nothing to the captured log";
    return;
  }
  log.remove_name();  // NCCL holds the file open now
  const std::set<std::string> found = parse_nccl_transports(mine);
  if (found.empty() && world_size_ > 1) {
    transports_unknown_why_ = "NCCL's log names no channel connection";
    return;
  }
  transports_ = transport_list(found);
}

void NcclCommunicator::forward_nccl_warnings() const {
  const NcclLog& log = NcclLog::instance();
  if (!log.capturing()) return;
  for (const std::string& line : nccl_warnings(log.read_from(log_offset_)))
    std::fprintf(stderr, "rank %d: %s\n", rank_, line.c_str());
  std::fflush(stderr);
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
    if (entry.collective.id == id) return entry;
  abort_job(__FILE__, __LINE__, "finish()", "collective #" + std::to_string(id) + " is not in flight");
}

ncclComm_t NcclCommunicator::lane_comm() {
  if (lane_ != CommLane::overlapped || !overlapped_comm_) return nccl_;
  ++overlapped_calls_;
  return overlapped_comm_;
}

template <typename Launch>
CommHandle NcclCommunicator::launch(CollectiveKind kind, const CollectiveArgs& args, Launch&& nccl_call) {
  InFlight entry;
  entry.collective = {++last_id_, kind, args.phase, payload_bytes(kind, args, world_size_)};
  entry.epoch = epoch_;
  entry.begin = take_event();
  entry.enqueued = take_event();
  entry.end = take_event();
  cudaEvent_t ready = take_event();
  // The hand-off: the comm stream starts only after everything compute has issued so far.
  CHECK_CUDA(cudaEventRecord(ready, compute_stream_));
  CHECK_CUDA(cudaStreamWaitEvent(comm_stream_, ready, 0));
  CHECK_CUDA(cudaEventRecord(entry.begin, comm_stream_));
  // Until `end` is recorded the event says nothing of this collective, so the watchdog
  // counts it in flight whatever the event says.
  auto end_recorded = std::make_shared<std::atomic<bool>>(false);
  watchdog_->watch(entry.collective, [end = entry.end, end_recorded] {
    return end_recorded->load() && cudaEventQuery(end) != cudaErrorNotReady;
  });
  in_flight_.push_back(entry);
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
  end_recorded->store(true);
  free_events_.push_back(ready);  // reusable once recorded: later waits use their own copy
  payload_bytes_by_kind_[static_cast<int>(kind)] += entry.collective.payload_bytes;
  return CommHandle{entry.collective.id};
}

CommHandle NcclCommunicator::start_allreduce(const CollectiveArgs& args) {
  check_collective_args(CollectiveKind::allreduce, args, world_size_, rank_);
  if (args.wire == WireType::f64) return start_host_allreduce(args);
  if (args.wire == WireType::bf16_from_f32) return start_bf16_allreduce(args);
  return launch(CollectiveKind::allreduce, args, [&](const auto&) {
    CHECK_NCCL(ncclAllReduce(args.send, args.recv, args.elems, ncclFloat, ncclSum, lane_comm(), comm_stream_));
  });
}

CommHandle NcclCommunicator::start_host_allreduce(const CollectiveArgs& args) {
  // The values and their sum are on the host, so MPI sums them there: through NCCL they
  // would take a copy to the device, a kernel and a synchronised copy back.
  SCALESTUDY_CHECK(args.elems <= static_cast<size_t>(std::numeric_limits<int>::max()),
                   "a host allreduce of " + std::to_string(args.elems) + " doubles is more than MPI counts");
  return launch(CollectiveKind::allreduce, args, [&](const auto& first_enqueued) {
    MPI_Request request;
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, args.recv, static_cast<int>(args.elems), MPI_DOUBLE, MPI_SUM, mpi_comm_,
                             &request));
    first_enqueued();
    CHECK_MPI(MPI_Wait(&request, MPI_STATUS_IGNORE));  // the watchdog ends a wait that never ends
  });
}

CommHandle NcclCommunicator::start_bf16_allreduce(const CollectiveArgs& args) {
  auto* buffer = static_cast<float*>(args.recv);
  wire_.reserve(wire_elems_for(CollectiveKind::allreduce, args.elems, args.wire));
  return launch(CollectiveKind::allreduce, args, [&](const auto& first_enqueued) {
    Bf16WireStaging::for_each_piece(args.elems, [&](size_t offset, size_t piece) {
      wire_.to_wire(buffer + offset, piece);
      first_enqueued();
      CHECK_NCCL(ncclAllReduce(wire_.at(), wire_.at(), piece, ncclBfloat16, ncclSum, lane_comm(), comm_stream_));
      wire_.from_wire(buffer + offset, piece);
    });
  });
}

size_t NcclCommunicator::wire_elems_for(CollectiveKind kind, size_t elems, WireType wire) const {
  if (wire != WireType::bf16_from_f32) return 0;
  const size_t piece = std::min(elems, Bf16WireStaging::kPieceElems);
  if (kind == CollectiveKind::allreduce) return piece;
  if (kind == CollectiveKind::reduce_scatter) return piece * static_cast<size_t>(world_size_);
  return 0;
}

CommHandle NcclCommunicator::start_reduce_scatter(const CollectiveArgs& args) {
  check_collective_args(CollectiveKind::reduce_scatter, args, world_size_, rank_);
  if (args.wire == WireType::bf16_from_f32) return start_bf16_reduce_scatter(args);
  return launch(CollectiveKind::reduce_scatter, args, [&](const auto&) {
    CHECK_NCCL(ncclReduceScatter(args.send, args.recv, args.elems, ncclFloat, ncclSum, lane_comm(), comm_stream_));
  });
}

CommHandle NcclCommunicator::start_bf16_reduce_scatter(const CollectiveArgs& args) {
  const auto* send = static_cast<const float*>(args.send);
  auto* recv = static_cast<float*>(args.recv);
  const size_t world = static_cast<size_t>(world_size_), recv_elems = args.elems;
  wire_.reserve(wire_elems_for(CollectiveKind::reduce_scatter, recv_elems, args.wire));
  return launch(CollectiveKind::reduce_scatter, args, [&](const auto& first_enqueued) {
    Bf16WireStaging::for_each_piece(recv_elems, [&](size_t offset, size_t piece) {
      // Piece `offset` of every rank's chunk, side by side as NCCL's send layout wants.
      for (size_t r = 0; r < world; ++r) wire_.to_wire(send + r * recv_elems + offset, piece, r * piece);
      first_enqueued();
      const size_t own = static_cast<size_t>(rank_) * piece;  // in place
      CHECK_NCCL(ncclReduceScatter(wire_.at(), wire_.at(own), piece, ncclBfloat16, ncclSum, lane_comm(), comm_stream_));
      wire_.from_wire(recv + offset, piece, own);
    });
  });
}

CommHandle NcclCommunicator::start_allgather(const CollectiveArgs& args) {
  check_collective_args(CollectiveKind::allgather, args, world_size_, rank_);
  return launch(CollectiveKind::allgather, args, [&](const auto&) {
    CHECK_NCCL(ncclAllGather(args.send, args.recv, args.elems, nccl_type(args.wire), lane_comm(), comm_stream_));
  });
}

CommHandle NcclCommunicator::start_broadcast(const CollectiveArgs& args, int root) {
  check_collective_args(CollectiveKind::broadcast, args, world_size_, rank_);
  check_broadcast_root(root, world_size_, args.phase);
  return launch(CollectiveKind::broadcast, args, [&](const auto&) {
    CHECK_NCCL(ncclBroadcast(args.send, args.recv, args.elems, nccl_type(args.wire), root, nccl_, comm_stream_));
  });
}

CommHandle NcclCommunicator::start_barrier(const std::string& phase) {
  CollectiveArgs args;
  args.phase = phase;
  return launch(CollectiveKind::barrier, args, [&](const auto&) {
    CHECK_NCCL(ncclAllReduce(device_barrier_, device_barrier_, 1, ncclInt, ncclSum, nccl_, comm_stream_));
  });
}

void NcclCommunicator::finish(CommHandle handle) {
  InFlight& entry = find(handle.id);
  if (entry.finished) return;
  // Every collective runs on the comm stream, in the order started, so one wait covers
  // the earlier ones: each wait of its own would cost the GPU's front end a few
  // microseconds while the collective after it waits to start.
  for (InFlight& earlier : in_flight_)
    if (earlier.collective.id < handle.id) earlier.finished = true;
  entry.finished = true;
  entry.wait_begin = take_event();
  entry.wait_end = take_event();
  CHECK_CUDA(cudaEventRecord(entry.wait_begin, compute_stream_));
  CHECK_CUDA(cudaStreamWaitEvent(compute_stream_, entry.end, 0));
  CHECK_CUDA(cudaEventRecord(entry.wait_end, compute_stream_));
}

void NcclCommunicator::finish_all() {
  std::vector<uint64_t> open;
  for (const InFlight& entry : in_flight_)
    if (!entry.finished) open.push_back(entry.collective.id);
  for (uint64_t id : open) finish(CommHandle{id});
}

void NcclCommunicator::set_epoch(std::chrono::steady_clock::time_point) {
  // A fresh event: collectives still in flight keep measuring from the origin of the
  // step that started them.
  const bool epoch_in_use = std::any_of(in_flight_.begin(), in_flight_.end(),
                                        [this](const InFlight& e) { return e.epoch == epoch_; });
  if (!epoch_in_use) free_events_.push_back(epoch_);
  epoch_ = take_event();
  CHECK_CUDA(cudaEventRecord(epoch_, compute_stream_));
}

std::vector<CollectiveRecord> NcclCommunicator::take_records() {
  std::vector<CollectiveRecord> records;
  while (!in_flight_.empty() && in_flight_.front().finished) {
    const InFlight entry = in_flight_.front();
    const bool waited = entry.wait_end != nullptr;
    CHECK_CUDA(cudaEventSynchronize(waited ? entry.wait_end : entry.end));
    CollectiveRecord record = record_of(entry.collective);
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
    recycle_events(entry);
  }
  return records;
}

void NcclCommunicator::recycle_events(const InFlight& entry) {
  watchdog_->forget(entry.collective.id);  // its test reads `end`, which a later collective may reuse
  for (cudaEvent_t event : {entry.begin, entry.enqueued, entry.end, entry.wait_begin, entry.wait_end})
    if (event) free_events_.push_back(event);
  const bool epoch_in_use =
      entry.epoch == epoch_ ||
      std::any_of(in_flight_.begin(), in_flight_.end(), [&](const InFlight& e) { return e.epoch == entry.epoch; });
  if (!epoch_in_use && std::find(free_events_.begin(), free_events_.end(), entry.epoch) == free_events_.end())
    free_events_.push_back(entry.epoch);
}

std::vector<size_t> NcclCommunicator::payload_bytes_by_kind() const {
  return std::vector<size_t>(payload_bytes_by_kind_.begin(), payload_bytes_by_kind_.end());
}

void NcclCommunicator::check_async_errors() const {
  for (ncclComm_t comm : {nccl_, overlapped_comm_}) {
    ncclResult_t async_error = ncclSuccess;
    if (comm && ncclCommGetAsyncError(comm, &async_error) == ncclSuccess && async_error != ncclSuccess &&
        async_error != ncclInProgress) {
      forward_nccl_warnings();
      abort_job(__FILE__, __LINE__, "NCCL asynchronous error",
                std::string(ncclGetErrorString(async_error)) + " on rank " + std::to_string(rank_));
    }
  }
}

void NcclCommunicator::abort_timed_out(const std::string& message) {
  // Both communicators, so that neither leaves a kernel spinning.
  for (ncclComm_t comm : {nccl_, overlapped_comm_})
    if (comm) ncclCommAbort(comm);
  forward_nccl_warnings();
  abort_job(__FILE__, __LINE__, "collective timed out", message);
}

}  // namespace scalestudy
#endif
