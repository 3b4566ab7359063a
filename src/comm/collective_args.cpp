#include "comm/collective_args.h"

#include <cstdint>

#include "core/check.h"

namespace scalestudy {
namespace {

bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a_begin < b_begin + b_bytes && b_begin < a_begin + a_bytes;
}

std::string where(CollectiveKind kind, const CollectiveArgs& args) {
  return std::string(collective_kind_name(kind)) + " (phase " + args.phase + ")";
}

void check_buffer(const void* buffer, size_t elems, CollectiveKind kind, const CollectiveArgs& args,
                  const char* which) {
  SCALESTUDY_CHECK(buffer != nullptr || elems == 0,
                   where(kind, args) + ": the " + which + " buffer is null but holds " + std::to_string(elems) +
                       " elements");
}

}  // namespace

const char* wire_type_name(WireType wire) {
  switch (wire) {
    case WireType::f32: return "f32";
    case WireType::f64: return "f64";
    case WireType::bf16_from_f32: return "bf16_from_f32";
    case WireType::u16: return "u16";
  }
  return "?";
}

size_t wire_bytes(WireType wire) {
  switch (wire) {
    case WireType::f64: return 8;
    case WireType::bf16_from_f32:
    case WireType::u16: return 2;
    case WireType::f32: break;
  }
  return 4;
}

size_t memory_bytes(WireType wire) { return wire == WireType::bf16_from_f32 ? sizeof(float) : wire_bytes(wire); }

CollectiveArgs collective_args(const float* send, float* recv, size_t elems, std::string phase, WireType wire) {
  SCALESTUDY_CHECK(wire == WireType::f32 || wire == WireType::bf16_from_f32,
                   std::string("float buffers travel as f32 or bf16_from_f32, not ") + wire_type_name(wire) +
                       " (phase " + phase + ")");
  return CollectiveArgs{send, recv, elems, wire, std::move(phase)};
}

CollectiveArgs collective_args(const double* send, double* recv, size_t elems, std::string phase) {
  return CollectiveArgs{send, recv, elems, WireType::f64, std::move(phase)};
}

CollectiveArgs collective_args(const uint16_t* send, uint16_t* recv, size_t elems, std::string phase) {
  return CollectiveArgs{send, recv, elems, WireType::u16, std::move(phase)};
}

bool supports(CollectiveKind kind, WireType wire) {
  switch (kind) {
    case CollectiveKind::allreduce: return wire != WireType::u16;
    case CollectiveKind::reduce_scatter: return wire == WireType::f32 || wire == WireType::bf16_from_f32;
    case CollectiveKind::allgather: return wire == WireType::f32 || wire == WireType::u16;
    case CollectiveKind::broadcast: return wire == WireType::f32;
    case CollectiveKind::barrier: break;
  }
  return false;
}

size_t payload_bytes(CollectiveKind kind, const CollectiveArgs& args, int world_size) {
  const size_t chunks =
      kind == CollectiveKind::reduce_scatter || kind == CollectiveKind::allgather ? static_cast<size_t>(world_size) : 1;
  return kind == CollectiveKind::barrier ? 0 : args.elems * chunks * wire_bytes(args.wire);
}

void check_collective_args(CollectiveKind kind, const CollectiveArgs& args, int world_size, int rank) {
  if (kind == CollectiveKind::barrier) return;  // no buffers
  SCALESTUDY_CHECK(supports(kind, args.wire),
                   where(kind, args) + " does not run on wire type " + wire_type_name(args.wire));
  const size_t world = static_cast<size_t>(world_size);
  const size_t send_elems = kind == CollectiveKind::reduce_scatter ? args.elems * world : args.elems;
  const size_t recv_elems = kind == CollectiveKind::allgather ? args.elems * world : args.elems;
  check_buffer(args.send, send_elems, kind, args, "send");
  check_buffer(args.recv, recv_elems, kind, args, "recv");
  const size_t element_bytes = memory_bytes(args.wire);
  const bool overlap =
      ranges_overlap(args.send, send_elems * element_bytes, args.recv, recv_elems * element_bytes);
  switch (kind) {
    case CollectiveKind::allreduce:
    case CollectiveKind::broadcast:
      SCALESTUDY_CHECK(args.send == args.recv, where(kind, args) + " runs in place: send must be recv");
      return;
    case CollectiveKind::reduce_scatter:
      SCALESTUDY_CHECK(!overlap, where(kind, args) + ": the recv buffer overlaps the send buffer");
      return;
    case CollectiveKind::allgather: {
      const size_t own_offset_bytes = static_cast<size_t>(rank) * args.elems * element_bytes;
      const auto* own_chunk = static_cast<const char*>(args.recv) + own_offset_bytes;
      SCALESTUDY_CHECK(args.send == own_chunk || !overlap,
                       where(kind, args) + ": the send buffer overlaps the recv buffer but is not this rank's "
                                           "chunk of it");
      return;
    }
    case CollectiveKind::barrier: return;
  }
}

void check_broadcast_root(int root, int world_size, const std::string& phase) {
  SCALESTUDY_CHECK(root >= 0 && root < world_size,
                   "broadcast root " + std::to_string(root) + " is not a rank of this " + std::to_string(world_size) +
                       "-rank communicator (phase " + phase + ")");
}

}  // namespace scalestudy
