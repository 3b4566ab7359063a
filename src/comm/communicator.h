#pragma once
// Asynchronous collectives as start/finish pairs. start_* queues the collective on the
// comm stream and returns at once; finish(handle) waits for it. Collectives run on the
// comm stream in the order they were started, on every rank, so every rank must start
// the same collectives in the same order.
//
// The buffers must stay valid and untouched by compute until finish() returns.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/collective_args.h"
#include "timing/phases.h"

namespace scalestudy {

struct CommHandle {
  uint64_t id = 0;
};

// What a collective runs beside. overlapped: compute that is expected to hide it, such as a
// bucket started while backward still has whole blocks to run; a communicator may give it
// fewer of the GPU's multiprocessors, so that the compute beside it slows less (NCCL's
// kernels hold them for as long as a collective lasts). awaited: compute will wait for it
// soon, so it runs as fast as it can.
enum class CommLane { awaited, overlapped };

class Communicator {
 public:
  // A communicator owns its connection to the other ranks: it is never copied.
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // One start per kind of collective; args describes the buffers and what travels
  // (comm/collective_args.h, whose table says what each kind accepts). Records count the
  // bytes that travel: a bf16_from_f32 collective counts its bf16 bytes.
  virtual CommHandle start_allreduce(const CollectiveArgs& args) = 0;
  virtual CommHandle start_reduce_scatter(const CollectiveArgs& args) = 0;
  virtual CommHandle start_allgather(const CollectiveArgs& args) = 0;
  virtual CommHandle start_broadcast(const CollectiveArgs& args, int root) = 0;
  virtual CommHandle start_barrier(const std::string& phase) = 0;

  // The lane of the collectives started from now on (LaneScope sets it for a scope);
  // awaited until set. Every rank must start the same collectives in the same lanes.
  virtual void set_lane(CommLane lane) { (void)lane; }
  // The most multiprocessors an overlapped-lane collective's kernels hold on this rank's
  // GPU, where the communicator bounds them; 0 where it does not (or runs none).
  virtual int overlapped_lane_multiprocessors() const { return 0; }

  // Waits for a collective, and so for every one started before it: a communicator runs
  // its collectives in the order they start, so one wait for the latest covers them all,
  // and those earlier ones record no wait of their own. A collective that does not finish
  // within the timeout ends the job with a message naming the rank, the collective and
  // its phase.
  virtual void finish(CommHandle handle) = 0;
  // Waits for every collective started so far.
  virtual void finish_all() = 0;

  // Record times are seconds since this point (the trainer sets it at each step start).
  virtual void set_epoch(std::chrono::steady_clock::time_point epoch) = 0;
  // Hands over the records of the collectives finished since the last call.
  virtual std::vector<CollectiveRecord> take_records() = 0;
  // Total bytes ever sent through each kind of collective (payload, not wire bytes).
  virtual std::vector<size_t> payload_bytes_by_kind() const = 0;
  // Bytes the communicator holds for staging (the bf16 wire buffers), at their peak.
  virtual size_t staging_bytes() const { return 0; }
  // The staging_bytes() that one collective of `kind` over `elems` elements in `wire`
  // (CollectiveArgs' elems and wire) holds, without starting it: the memory preflight's
  // term for the communicator's buffers. Staging is held for the largest collective, so
  // a run's staging is this for its largest one.
  virtual size_t staging_bytes_for(CollectiveKind kind, size_t elems, WireType wire) const {
    (void)kind, (void)elems, (void)wire;
    return 0;
  }
  // The device stream collectives run on (a cudaStream_t), for the kernel tracer to name;
  // nullptr when they run on the host.
  virtual void* native_stream() const { return nullptr; }

  // Blocking conveniences built on the pairs.
  void allreduce(float* buffer, size_t elems, const std::string& phase) {
    finish(start_allreduce(in_place(buffer, elems, phase)));
  }
  void allreduce(double* buffer, size_t elems, const std::string& phase) {
    finish(start_allreduce(in_place(buffer, elems, phase)));
  }
  void broadcast(float* buffer, size_t elems, int root, const std::string& phase) {
    finish(start_broadcast(in_place(buffer, elems, phase), root));
  }
  void barrier(const std::string& phase) { finish(start_barrier(phase)); }
};

// Starts the collectives of its scope in `lane`, and the later ones awaited again.
class LaneScope {
 public:
  LaneScope(Communicator& comm, CommLane lane) : comm_(comm) { comm_.set_lane(lane); }
  ~LaneScope() { comm_.set_lane(CommLane::awaited); }
  LaneScope(const LaneScope&) = delete;
  LaneScope& operator=(const LaneScope&) = delete;

 private:
  Communicator& comm_;
};

}  // namespace scalestudy
