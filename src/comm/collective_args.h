#pragma once
// What one collective runs on: its buffers, their element count, what travels on the wire
// and the phase that started it. One description serves every kind of collective, as one
// table of collectives does in nccl-tests; what each kind accepts is in the table below.
//
//   kind            elems counts                      send / recv                 wire types
//   allreduce       the buffer                        in place: send == recv      f32, f64, bf16_from_f32
//   reduce_scatter  each rank's chunk (recv)          world_size chunks -> one    f32, bf16_from_f32
//   allgather       each rank's chunk (send)          one chunk -> world_size     f32, u16
//   broadcast       the buffer                        in place: send == recv      f32
//
// reduce_scatter: rank r receives the sum of chunk r; recv must not overlap send.
// allgather: chunk r of recv comes from rank r; in place when send is this rank's chunk
// of recv, and otherwise send must not overlap recv.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "timing/phases.h"

namespace scalestudy {

// What the elements are in memory and on the wire.
enum class WireType {
  f32,            // float in memory and on the wire
  f64,            // double in memory and on the wire; host memory on every communicator
  bf16_from_f32,  // float in memory, bf16 on the wire (gradients, --grad-reduce bf16): each
                  // rank's values are rounded to bf16 (to nearest even), every addition is
                  // done in fp32 and rounded to bf16 again, as NCCL sums bf16, and the sum is
                  // widened back into the fp32 result
  u16,            // 16-bit words (a backend's 16-bit copy of the parameters), moved unchanged
};
const char* wire_type_name(WireType wire);
// Bytes of one element on the wire, which the records count, and in the buffers.
size_t wire_bytes(WireType wire);
size_t memory_bytes(WireType wire);

struct CollectiveArgs {
  const void* send = nullptr;
  void* recv = nullptr;
  size_t elems = 0;  // see the table above
  WireType wire = WireType::f32;
  std::string phase;  // the training phase that started it, for records and timeouts
};

// The typed ways to fill one in: the wire type follows the element type, and only float
// buffers may choose theirs (f32 or bf16_from_f32).
CollectiveArgs collective_args(const float* send, float* recv, size_t elems, std::string phase,
                               WireType wire = WireType::f32);
CollectiveArgs collective_args(const double* send, double* recv, size_t elems, std::string phase);
CollectiveArgs collective_args(const uint16_t* send, uint16_t* recv, size_t elems, std::string phase);
// The in-place form of allreduce and broadcast.
template <class T>
CollectiveArgs in_place(T* buffer, size_t elems, std::string phase) {
  return collective_args(buffer, buffer, elems, std::move(phase));
}
inline CollectiveArgs in_place(float* buffer, size_t elems, std::string phase, WireType wire) {
  return collective_args(buffer, buffer, elems, std::move(phase), wire);
}

// What names one collective a communicator has started, in its records and its timeouts.
struct StartedCollective {
  uint64_t id = 0;  // 1, 2, ... in the order started
  CollectiveKind kind = CollectiveKind::barrier;
  std::string phase;
  size_t payload_bytes = 0;
};

// Its record, still without times.
inline CollectiveRecord record_of(const StartedCollective& collective) {
  CollectiveRecord record;
  record.kind = collective.kind;
  record.phase = collective.phase;
  record.payload_bytes = collective.payload_bytes;
  return record;
}

// Whether `kind` runs on `wire` (the table above).
bool supports(CollectiveKind kind, WireType wire);
// The bytes that travel, as the records count them: the full buffer the collective covers
// (world_size chunks for reduce_scatter and allgather), in wire elements.
size_t payload_bytes(CollectiveKind kind, const CollectiveArgs& args, int world_size);
// Ends the job, naming the phase, when the arguments break the table's rules for a
// communicator of world_size ranks in which this one is `rank`.
void check_collective_args(CollectiveKind kind, const CollectiveArgs& args, int world_size, int rank);
// Ends the job, naming the phase, when root is not a rank of the communicator.
void check_broadcast_root(int root, int world_size, const std::string& phase);

}  // namespace scalestudy
