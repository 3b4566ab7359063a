#pragma once
// A communicator that passes every call to another one. Tests derive from it to change
// one answer (the lane it reports, a record of what started) around a real communicator.
#include <chrono>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace scalestudy {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(Communicator& inner) : inner_(inner) {}

  std::string name() const override { return inner_.name(); }
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  CommHandle start_allreduce(const CollectiveArgs& args) override { return inner_.start_allreduce(args); }
  CommHandle start_reduce_scatter(const CollectiveArgs& args) override { return inner_.start_reduce_scatter(args); }
  CommHandle start_allgather(const CollectiveArgs& args) override { return inner_.start_allgather(args); }
  CommHandle start_broadcast(const CollectiveArgs& args, int root) override {
    return inner_.start_broadcast(args, root);
  }
  CommHandle start_barrier(const std::string& phase) override { return inner_.start_barrier(phase); }
  void set_lane(CommLane lane) override { inner_.set_lane(lane); }
  int overlapped_lane_multiprocessors() const override { return inner_.overlapped_lane_multiprocessors(); }
  void finish(CommHandle handle) override { inner_.finish(handle); }
  void finish_all() override { inner_.finish_all(); }
  void set_epoch(std::chrono::steady_clock::time_point epoch) override { inner_.set_epoch(epoch); }
  std::vector<CollectiveRecord> take_records() override { return inner_.take_records(); }
  std::vector<size_t> payload_bytes_by_kind() const override { return inner_.payload_bytes_by_kind(); }
  size_t staging_bytes() const override { return inner_.staging_bytes(); }
  size_t staging_bytes_for(CollectiveKind kind, size_t elems, WireType wire) const override {
    return inner_.staging_bytes_for(kind, elems, wire);
  }
  void* native_stream() const override { return inner_.native_stream(); }

 private:
  Communicator& inner_;
};

}  // namespace scalestudy
