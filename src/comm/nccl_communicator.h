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
//   stream wait on a host word set after ncclAllReduce, hung the 2-GPU tests under NCCL
//   2.28: its enqueue seems to wait for the stream.)
//   finish:   the compute stream waits for `end` (recording `wait_begin`/`wait_end`
//             around the wait); the host returns at once.
//
// double buffers are host memory (norms): MPI sums them on the host, and start_allreduce
// returns with the result in place. Their record's interval is the host's time in MPI, as
// seen by the idle comm stream.
//
// The bf16 forms run, all on the comm stream and in pieces of at most kWirePieceElems:
// cast the piece to bf16 into a staging buffer, run the NCCL bf16 collective in place
// there, cast the result back into the fp32 destination. The comm stream runs one piece
// after another, so one staging buffer serves every collective; it grows to the largest
// piece asked for (the first step's), and staging_bytes() reports it.
//
// Lanes (--overlapped-ctas). A float collective started in CommLane::overlapped runs on a
// second NCCL communicator, split off with at most overlapped_ctas CTAs, when there is
// one: NCCL's kernels then hold fewer multiprocessors beside the compute that hides them.
// That communicator launches its kernels in clusters of kOverlappedClusterCtas CTAs.
// On sm90 NCCL's default is 4, a cluster must fit within one GPC, and the GEMMs beside the
// lane run in clusters of 2. A 4-CTA cluster launched after one of those GEMMs waited about
// 0.45 ms, for the GEMM's first tiles to end. Clusters of 1 started at once, but the step
// was 0.8 ms longer; clusters of 2 made it 0.3 ms shorter (docs/performance-notes.md,
// change 27). NCCL_CGA_CLUSTER_SIZE overrides this value, as it does for every
// communicator.
// Both communicators run on the comm stream, one collective after another, in the order
// they were started.
//
// A watchdog thread checks every collective in flight: one that has not finished within
// the timeout, or an asynchronous NCCL error, ends the job with a message naming the
// rank, the collective and its phase.
#if SCALESTUDY_HAVE_CUDA
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace scalestudy {

class NcclCommunicator final : public Communicator {
 public:
  // The current CUDA device must already be set; compute_stream is the backend's.
  // overlapped_ctas: the CTAs of the overlapped lane's NCCL kernels, at most (above); 0
  // runs both lanes alike.
  NcclCommunicator(MPI_Comm comm, cudaStream_t compute_stream, double timeout_s, int overlapped_ctas = 0);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  CommHandle start_allreduce(float* buffer, size_t elems, const std::string& phase) override;
  CommHandle start_allreduce(double* host_buffer, size_t elems, const std::string& phase) override;
  CommHandle start_reduce_scatter(const float* send, float* recv, size_t recv_elems,
                                  const std::string& phase) override;
  CommHandle start_allgather(const float* send, float* recv, size_t send_elems,
                             const std::string& phase) override;
  CommHandle start_allgather_16bit(const uint16_t* send, uint16_t* recv, size_t send_elems,
                                   const std::string& phase) override;
  CommHandle start_allreduce_in_bf16(float* buffer, size_t elems, const std::string& phase) override;
  CommHandle start_reduce_scatter_in_bf16(const float* send, float* recv, size_t recv_elems,
                                          const std::string& phase) override;
  CommHandle start_broadcast(float* buffer, size_t elems, int root, const std::string& phase) override;
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

  size_t staging_bytes() const override { return wire_elems_ * 2; }
  cudaStream_t comm_stream() const { return comm_stream_; }
  // NCCL calls made on the overlapped lane's communicator so far.
  size_t overlapped_calls() const { return overlapped_calls_; }
  // Elements of the largest piece a bf16 collective sends at once (per rank's chunk, for
  // reduce-scatter): 128 MiB of staging at most.
  static constexpr size_t kWirePieceElems = size_t(64) << 20;
  // The CTAs of one cluster of the overlapped lane's kernels (see "Lanes" above).
  static constexpr int kOverlappedClusterCtas = 2;
  void* native_stream() const override { return comm_stream_; }
  static std::string nccl_version();

 private:
  struct InFlight {
    uint64_t id = 0;
    CollectiveKind kind = CollectiveKind::barrier;
    std::string phase;
    size_t payload_bytes = 0;
    cudaEvent_t begin = nullptr, enqueued = nullptr, end = nullptr;
    // Null until finish(), and for good when a later collective's finish() covered it.
    cudaEvent_t wait_begin = nullptr, wait_end = nullptr;
    cudaEvent_t epoch = nullptr;  // the step origin in force when it started
    std::chrono::steady_clock::time_point started_at{};
    bool finished = false;
  };

  template <typename Launch>
  CommHandle launch(CollectiveKind kind, const std::string& phase, size_t payload_bytes, Launch&& nccl_call);
  cudaEvent_t take_event();
  // The staging buffer, holding at least `elems` bf16 values (host side, before enqueueing).
  void* wire_buffer(size_t elems);
  InFlight& find(uint64_t id);
  // The NCCL communicator of the lane in force, for one NCCL call.
  ncclComm_t lane_comm() {
    if (lane_ != CommLane::overlapped || !overlapped_comm_) return nccl_;
    ++overlapped_calls_;
    return overlapped_comm_;
  }
  void watchdog_loop();
  // Ends the job for a collective that did not finish within the timeout (mutex_ held).
  [[noreturn]] void abort_timed_out(const InFlight& entry);

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_size_ = 1;
  double timeout_s_;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t compute_stream_;
  cudaStream_t comm_stream_ = nullptr;
  cudaStream_t marker_stream_ = nullptr;  // only ever records the `enqueued` events
  cudaEvent_t epoch_ = nullptr;
  std::vector<cudaEvent_t> all_events_, free_events_;
  int* device_barrier_ = nullptr;
  void* wire_ = nullptr;  // bf16 staging of the bf16 collectives
  ncclComm_t overlapped_comm_ = nullptr;  // at most overlapped_ctas CTAs; null without
  int overlapped_ctas_ = 0;
  CommLane lane_ = CommLane::awaited;
  size_t overlapped_calls_ = 0;
  size_t wire_elems_ = 0;
  uint64_t last_id_ = 0;
  std::array<size_t, kCollectiveKindCount> payload_bytes_by_kind_{};

  std::mutex mutex_;  // guards in_flight_ between the main thread and the watchdog
  std::deque<InFlight> in_flight_;
  std::atomic<bool> stopping_{false};
  std::thread watchdog_;
};

}  // namespace scalestudy
#endif
