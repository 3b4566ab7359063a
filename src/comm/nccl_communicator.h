#pragma once
// The NCCL implementation of Communicator: collectives run on a comm stream of their
// own, ordered against the compute stream with events. This is the one place where the
// two streams hand work to each other:
//
//   compute: ─ backward writes bucket ─[ready]──────── more backward ────[wait]─ optimizer
//                                          │                               ▲
//   comm:                                  └─▶[begin] ncclAllReduce [end]──┘
//
//   start_*:  record `ready` on compute; the comm stream waits for it, records `begin`,
//             runs the NCCL call, records `end`. The host returns at once.
//
//   `begin` is passed as soon as the comm stream reaches it. When the comm stream is idle
//   that can be before the host has enqueued the NCCL call, whose kernel then starts
//   later. So an `enqueued` event is also recorded, on an idle stream of its own, right
//   after the host has enqueued the collective's first operation, and the record's begin
//   is the later of the two. (Holding the comm stream until the enqueue returns, with a
//   stream wait on a host word set after the NCCL call, hangs under NCCL 2.28: its
//   enqueue waits for the stream.)
//   finish:   the compute stream waits for `end` (recording `wait_begin`/`wait_end`
//             around the wait); the host returns at once.
//
// Wire types. f32 and u16 run as NCCL's own collectives (u16 words as a 16-bit type, which
// a gather moves unchanged). bf16_from_f32 runs through a bf16 staging buffer on the comm
// stream (comm/bf16_wire_staging.h). f64 buffers are host memory (norms): MPI sums them on
// the host, and start_allreduce returns with the result in place; their record's interval
// is the host's time in MPI, as seen by the idle comm stream.
//
// Lanes (--overlapped-ctas). A device collective started in CommLane::overlapped runs on a
// second NCCL communicator, split off with at most overlapped_ctas CTAs, when there is
// one: NCCL's kernels then hold fewer multiprocessors beside the compute that hides them.
// Both communicators run on the comm stream, one collective after another, in the order
// they were started. The overlapped lane launches its kernels in clusters of
// kOverlappedClusterCtas CTAs. A cluster must fit within one GPC, and the GEMMs beside the
// lane run in clusters of 2, so a cluster of NCCL's default 4 CTAs waits for those GEMMs'
// first tiles to end, while single CTAs take multiprocessors the GEMMs' pairs cannot use:
// clusters of 2 start as soon as they are ready and leave the GEMMs whole pairs.
// NCCL_CGA_CLUSTER_SIZE overrides this value, as it does for every communicator.
//
// Links. Before NCCL's first call the constructor has NCCL's log sent to a private file
// (comm/nccl_transport.h); once the communicators exist, one small allreduce on each makes
// NCCL connect its channels (since 2.22 it connects them at the first collective), and the
// transports its log names are this rank's transports(). NCCL's warnings in that log are
// copied to stderr when the communicator ends or aborts.
//
// The watchdog (comm/collective_watchdog.h) times every collective from its start until
// its `end` has passed, and also ends the job on an asynchronous NCCL error; on a timeout
// it aborts the NCCL communicators first, so that no kernel is left spinning.
#if SCALESTUDY_HAVE_CUDA
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/bf16_wire_staging.h"
#include "comm/collective_watchdog.h"
#include "comm/communicator.h"

namespace scalestudy {

class NcclCommunicator final : public Communicator {
 public:
  // The current CUDA device must already be set; compute_stream is the backend's.
  // overlapped_ctas: the CTAs of the overlapped lane's NCCL kernels, at most (above); 0
  // runs both lanes alike.
  NcclCommunicator(MPI_Comm comm, cudaStream_t compute_stream, double timeout_s, int overlapped_ctas = 0);
  ~NcclCommunicator() override;

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  CommHandle start_allreduce(const CollectiveArgs& args) override;
  CommHandle start_reduce_scatter(const CollectiveArgs& args) override;
  CommHandle start_allgather(const CollectiveArgs& args) override;
  CommHandle start_broadcast(const CollectiveArgs& args, int root) override;
  CommHandle start_barrier(const std::string& phase) override;

  void set_lane(CommLane lane) override { lane_ = lane; }
  int overlapped_lane_multiprocessors() const override {
    return overlapped_comm_ && world_size_ > 1 ? overlapped_ctas_ : 0;
  }
  void finish(CommHandle handle) override;
  void finish_all() override;
  void set_epoch(std::chrono::steady_clock::time_point epoch) override;
  std::vector<CollectiveRecord> take_records() override;
  std::vector<size_t> payload_bytes_by_kind() const override;
  size_t staging_bytes() const override { return wire_.bytes(); }
  // bf16_from_f32: the wire buffer for the collective's largest piece (all ranks' chunks
  // of it, for a reduce-scatter).
  size_t staging_bytes_for(CollectiveKind kind, size_t elems, WireType wire) const override {
    return wire_elems_for(kind, elems, wire) * sizeof(uint16_t);
  }
  void* native_stream() const override { return comm_stream_; }

  // NCCL calls made on the overlapped lane's communicator so far.
  size_t overlapped_calls() const { return overlapped_calls_; }
  // The CTAs of one cluster of the overlapped lane's kernels (see "Lanes" above).
  static constexpr int kOverlappedClusterCtas = 2;
  static std::string nccl_version();
  // The transports NCCL connected this rank through, measured from its log: e.g. "P2P",
  // "NET/Socket", "NET/IB,P2P"; "none" on one rank; "unknown" where the log was not
  // captured (nccl_transport.h), with the reason in transports_unknown_why().
  const std::string& transports() const { return transports_; }
  const std::string& transports_unknown_why() const { return transports_unknown_why_; }
  // The NCCL_* variables of this process when NCCL started, as NAME=VALUE.
  const std::map<std::string, std::string>& nccl_environment() const { return nccl_environment_; }

 private:
  struct InFlight {
    StartedCollective collective;
    cudaEvent_t begin = nullptr, enqueued = nullptr, end = nullptr;
    // Null until finish(), and for good when a later collective's finish() covered it.
    cudaEvent_t wait_begin = nullptr, wait_end = nullptr;
    cudaEvent_t epoch = nullptr;  // the step origin in force when it started
    bool finished = false;
  };

  // The hand-off above, around nccl_call(first_enqueued), which enqueues the collective's
  // operations on the comm stream and calls first_enqueued() after the first of them.
  template <typename Launch>
  CommHandle launch(CollectiveKind kind, const CollectiveArgs& args, Launch&& nccl_call);
  CommHandle start_host_allreduce(const CollectiveArgs& args);
  CommHandle start_bf16_allreduce(const CollectiveArgs& args);
  CommHandle start_bf16_reduce_scatter(const CollectiveArgs& args);
  // The bf16 elements the wire buffer needs for a collective (0 where it needs none).
  size_t wire_elems_for(CollectiveKind kind, size_t elems, WireType wire) const;
  cudaEvent_t take_event();
  void recycle_events(const InFlight& entry);
  InFlight& find(uint64_t id);
  // The NCCL communicator of the lane in force, for one NCCL call.
  ncclComm_t lane_comm();
  // The watchdog's hooks.
  void check_async_errors() const;
  // Connects the channels with one allreduce per communicator and reads the transports.
  void measure_transports(size_t log_offset);
  // NCCL's WARN lines logged since this communicator started, to stderr.
  void forward_nccl_warnings() const;
  [[noreturn]] void abort_timed_out(const std::string& message);

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_size_ = 1;
  ncclComm_t nccl_ = nullptr;
  ncclComm_t overlapped_comm_ = nullptr;  // at most overlapped_ctas CTAs; null without
  int overlapped_ctas_ = 0;
  CommLane lane_ = CommLane::awaited;
  size_t overlapped_calls_ = 0;
  cudaStream_t compute_stream_;
  cudaStream_t comm_stream_ = nullptr;
  cudaStream_t marker_stream_ = nullptr;  // only ever records the `enqueued` events
  cudaEvent_t epoch_ = nullptr;
  std::vector<cudaEvent_t> all_events_, free_events_;
  int* device_barrier_ = nullptr;
  Bf16WireStaging wire_;
  uint64_t last_id_ = 0;
  std::array<size_t, kCollectiveKindCount> payload_bytes_by_kind_{};
  // Main thread only: the watchdog keeps its own account of what is in flight.
  std::deque<InFlight> in_flight_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // started once the NCCL communicators are
  std::map<std::string, std::string> nccl_environment_;
  std::string transports_ = "unknown", transports_unknown_why_;
  size_t log_offset_ = 0;  // where this communicator's lines of NCCL's log begin
};

}  // namespace scalestudy
#endif
