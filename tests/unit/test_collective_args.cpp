// The description of one collective (comm/collective_args.h): the typed ways to fill it
// in, the table of what each kind accepts, and the bytes the records count.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/collective_args.h"

namespace scalestudy {
namespace {

TEST(CollectiveArgs, TheWireTypeFollowsTheElementType) {
  std::vector<float> floats(8);
  std::vector<double> doubles(8);
  std::vector<uint16_t> words(8);
  EXPECT_EQ(collective_args(floats.data(), floats.data(), 8, "a").wire, WireType::f32);
  EXPECT_EQ(collective_args(doubles.data(), doubles.data(), 8, "a").wire, WireType::f64);
  EXPECT_EQ(collective_args(words.data(), words.data(), 8, "a").wire, WireType::u16);
  const CollectiveArgs bf16 = in_place(floats.data(), 8, "grad-comm", WireType::bf16_from_f32);
  EXPECT_EQ(bf16.wire, WireType::bf16_from_f32);
  EXPECT_EQ(bf16.send, bf16.recv);
  EXPECT_EQ(bf16.recv, floats.data());
  EXPECT_EQ(bf16.elems, 8u);
  EXPECT_EQ(bf16.phase, "grad-comm");
}

TEST(CollectiveArgs, BytesOnTheWireAndInMemory) {
  EXPECT_EQ(wire_bytes(WireType::f32), 4u);
  EXPECT_EQ(wire_bytes(WireType::f64), 8u);
  EXPECT_EQ(wire_bytes(WireType::bf16_from_f32), 2u);
  EXPECT_EQ(wire_bytes(WireType::u16), 2u);
  EXPECT_EQ(memory_bytes(WireType::bf16_from_f32), 4u);
  EXPECT_EQ(memory_bytes(WireType::u16), 2u);
}

TEST(CollectiveArgs, WhatEachKindAccepts) {
  const std::vector<WireType> wires = {WireType::f32, WireType::f64, WireType::bf16_from_f32, WireType::u16};
  const auto accepted = [&](CollectiveKind kind) {
    std::vector<bool> row;
    for (WireType wire : wires) row.push_back(supports(kind, wire));
    return row;
  };
  EXPECT_EQ(accepted(CollectiveKind::allreduce), (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(accepted(CollectiveKind::reduce_scatter), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(accepted(CollectiveKind::allgather), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(accepted(CollectiveKind::broadcast), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(accepted(CollectiveKind::barrier), (std::vector<bool>{false, false, false, false}));
}

// Records count the bytes that travel: the full buffer, in wire elements.
TEST(CollectiveArgs, PayloadBytesCountTheWholeBufferOnTheWire) {
  CollectiveArgs args;
  args.elems = 100;
  const int world = 3;
  args.wire = WireType::f32;
  EXPECT_EQ(payload_bytes(CollectiveKind::allreduce, args, world), 400u);
  EXPECT_EQ(payload_bytes(CollectiveKind::broadcast, args, world), 400u);
  EXPECT_EQ(payload_bytes(CollectiveKind::reduce_scatter, args, world), 1200u);
  EXPECT_EQ(payload_bytes(CollectiveKind::allgather, args, world), 1200u);
  EXPECT_EQ(payload_bytes(CollectiveKind::barrier, args, world), 0u);
  args.wire = WireType::bf16_from_f32;
  EXPECT_EQ(payload_bytes(CollectiveKind::allreduce, args, world), 200u);
  EXPECT_EQ(payload_bytes(CollectiveKind::reduce_scatter, args, world), 600u);
  args.wire = WireType::f64;
  EXPECT_EQ(payload_bytes(CollectiveKind::allreduce, args, world), 800u);
  args.wire = WireType::u16;
  EXPECT_EQ(payload_bytes(CollectiveKind::allgather, args, world), 600u);
}

}  // namespace
}  // namespace scalestudy
