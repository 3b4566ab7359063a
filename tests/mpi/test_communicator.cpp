// MpiCommunicator and the MPI runtime, run under mpiexec at 1, 2, 3 and 4 ranks.
//
// Every input is a small integer or a power of two, chosen so that every partial sum in
// any order of summation is exactly representable. The result therefore does not depend
// on the order in which MPI adds the contributions, and comparing floats with == (bit for
// bit) is right: any difference at all is a bug, not rounding.
//
// Every rank runs the same collectives in the same order whatever it finds, so a failed
// expectation on one rank never leaves its peers waiting in a collective.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "control/mpi_check.h"

namespace scalestudy {
namespace {

constexpr double kTimeoutS = 120.0;

int world_rank() {
  int rank = 0;
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

int world_size() {
  int size = 1;
  CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

// The sum 1 + 2 + ... + world_size, which is what every rank contributing rank + 1 gives.
float rank_sum() {
  const int size = world_size();
  return static_cast<float>(size * (size + 1) / 2);
}

// Reports how many elements differ and the first of them, instead of one line each.
template <class T>
void expect_exact(const std::vector<T>& got, const std::function<T(size_t)>& expected,
                  const std::string& what) {
  size_t wrong_elems = 0;
  size_t first_wrong = got.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expected(i)) {
      if (wrong_elems == 0) first_wrong = i;
      ++wrong_elems;
    }
  }
  EXPECT_EQ(wrong_elems, 0u) << what << " on rank " << world_rank() << " of " << world_size()
                             << ": first mismatch at " << first_wrong << ": got "
                             << (first_wrong < got.size() ? got[first_wrong] : T{})
                             << ", expected " << (first_wrong < got.size() ? expected(first_wrong) : T{});
}

// Keeps the main thread busy with arithmetic, as a backward pass would.
void compute_for(const MpiCommunicator& comm, double seconds) {
  const double end_s = comm.epoch_seconds_now() + seconds;
  volatile double sink = 0.0;
  while (comm.epoch_seconds_now() < end_s) {
    for (int i = 1; i < 4096; ++i) sink = sink + std::sqrt(static_cast<double>(i));
  }
}

TEST(CollectiveKind, NamesMatchTheEnumerators) {
  EXPECT_STREQ(collective_kind_name(CollectiveKind::allreduce), "allreduce");
  EXPECT_STREQ(collective_kind_name(CollectiveKind::reduce_scatter), "reduce_scatter");
  EXPECT_STREQ(collective_kind_name(CollectiveKind::allgather), "allgather");
  EXPECT_STREQ(collective_kind_name(CollectiveKind::broadcast), "broadcast");
  EXPECT_STREQ(collective_kind_name(CollectiveKind::barrier), "barrier");
}

TEST(MpiRuntime, PlacementOnOneNode) {
  const ProcessPlacement placement = discover_placement(MPI_COMM_WORLD);
  EXPECT_EQ(placement.rank, world_rank());
  EXPECT_EQ(placement.world_size, world_size());
  // ctest starts every rank on this machine.
  EXPECT_EQ(placement.local_rank, placement.rank);
  EXPECT_EQ(placement.local_size, placement.world_size);
  EXPECT_EQ(placement.node_index, 0);
  EXPECT_EQ(placement.node_count, 1);
  EXPECT_FALSE(placement.host.empty());
}

TEST(MpiRuntime, ThreadMultipleIsGranted) {
  int provided = MPI_THREAD_SINGLE;
  CHECK_MPI(MPI_Query_thread(&provided));
  EXPECT_EQ(provided, MPI_THREAD_MULTIPLE);
}

TEST(MpiCommunicator, ReportsRankAndSize) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  EXPECT_EQ(comm.name(), "mpi");
  EXPECT_EQ(comm.rank(), world_rank());
  EXPECT_EQ(comm.world_size(), world_size());
}

TEST(MpiCommunicator, AllreduceFloatIsExact) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t elems = 10007;
  std::vector<float> buffer(elems);
  for (size_t i = 0; i < elems; ++i) buffer[i] = static_cast<float>((world_rank() + 1) * (i % 7 + 1));
  comm.allreduce(buffer.data(), elems, "test");
  expect_exact<float>(buffer, [](size_t i) { return rank_sum() * static_cast<float>(i % 7 + 1); },
                      "allreduce float");
}

TEST(MpiCommunicator, AllreduceDoubleIsExact) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t elems = 4099;
  std::vector<double> buffer(elems);
  for (size_t i = 0; i < elems; ++i) {
    buffer[i] = std::ldexp(static_cast<double>(world_rank() + 1), -static_cast<int>(i % 40));
  }
  comm.allreduce(buffer.data(), elems, "test");
  expect_exact<double>(
      buffer, [](size_t i) { return std::ldexp(static_cast<double>(rank_sum()), -static_cast<int>(i % 40)); },
      "allreduce double");
}

// Chunk c of rank r's send buffer holds (r + 1) * (c + 1) + i % 5.
std::vector<float> reduce_scatter_input(size_t recv_elems) {
  const int size = world_size();
  std::vector<float> send(recv_elems * static_cast<size_t>(size));
  for (int chunk = 0; chunk < size; ++chunk) {
    for (size_t i = 0; i < recv_elems; ++i) {
      send[static_cast<size_t>(chunk) * recv_elems + i] =
          static_cast<float>((world_rank() + 1) * (chunk + 1) + static_cast<int>(i % 5));
    }
  }
  return send;
}

float reduce_scatter_expected(size_t i) {
  return rank_sum() * static_cast<float>(world_rank() + 1) +
         static_cast<float>(world_size()) * static_cast<float>(i % 5);
}

TEST(MpiCommunicator, ReduceScatterIsExact) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t recv_elems = 2053;
  const std::vector<float> send = reduce_scatter_input(recv_elems);
  std::vector<float> recv(recv_elems, -1.0f);
  comm.finish(comm.start_reduce_scatter(collective_args(send.data(), recv.data(), recv_elems, "test")));
  expect_exact<float>(recv, reduce_scatter_expected, "reduce_scatter");
}

// The bf16 sums. Each rank adds 2^-10 to the integer values above: bf16 (8 significant
// bits) rounds it away from every integer from 1 to 255, so the exact integer sums come
// back if, and only if, each rank's values were rounded to bf16 before they were summed.
constexpr float kBelowBf16 = 0x1p-10f;

TEST(MpiCommunicator, AllreduceInBf16RoundsEachRanksValues) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t elems = 10007;
  std::vector<float> buffer(elems);
  for (size_t i = 0; i < elems; ++i)
    buffer[i] = static_cast<float>((world_rank() + 1) * (i % 7 + 1)) + kBelowBf16;
  comm.finish(comm.start_allreduce(in_place(buffer.data(), elems, "test", WireType::bf16_from_f32)));
  expect_exact<float>(buffer, [](size_t i) { return rank_sum() * static_cast<float>(i % 7 + 1); },
                      "allreduce in bf16");
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].payload_bytes, elems * 2) << "bf16 collectives send 2 bytes per element";
  EXPECT_EQ(comm.staging_bytes(), elems * 2) << "the bf16 copy of the buffer is staging";
}

// 1 + 2^-8 lies half-way between the bf16 values 1 and 1 + 2^-7 and rounds to the even 1:
// a sum that kept fp32 partial sums would return 1 + 2^-8.
TEST(MpiCommunicator, AllreduceInBf16RoundsEveryPartialSum) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t elems = 64;
  const float own = world_rank() == 0 ? 1.0f : world_rank() == 1 ? 0x1p-8f : 0.0f;
  std::vector<float> buffer(elems, own);
  comm.finish(comm.start_allreduce(in_place(buffer.data(), elems, "test", WireType::bf16_from_f32)));
  expect_exact<float>(buffer, [](size_t) { return 1.0f; }, "allreduce in bf16, a tie");
}

TEST(MpiCommunicator, ReduceScatterInBf16RoundsEachRanksValues) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t recv_elems = 2053;
  std::vector<float> send = reduce_scatter_input(recv_elems);
  for (float& value : send) value += kBelowBf16;
  std::vector<float> recv(recv_elems, -1.0f);
  comm.finish(comm.start_reduce_scatter(
      collective_args(send.data(), recv.data(), recv_elems, "test", WireType::bf16_from_f32)));
  expect_exact<float>(recv, reduce_scatter_expected, "reduce_scatter in bf16");
}

float allgather_value(int owner, size_t i) {
  return static_cast<float>(owner * 100000 + static_cast<int>(i));
}

// Allgathers this rank's chunk of allgather_value, sent from a buffer of its own or, in
// place, from the rank's chunk of the result, and checks every rank's chunk.
void expect_exact_allgather(bool in_place, const std::string& what) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t send_elems = 1031;
  std::vector<float> own(send_elems), recv(send_elems * static_cast<size_t>(world_size()), -1.0f);
  float* send = in_place ? recv.data() + static_cast<size_t>(world_rank()) * send_elems : own.data();
  for (size_t i = 0; i < send_elems; ++i) send[i] = allgather_value(world_rank(), i);
  comm.finish(comm.start_allgather(collective_args(send, recv.data(), send_elems, "test")));
  expect_exact<float>(recv, [&](size_t i) {
    return allgather_value(static_cast<int>(i / send_elems), i % send_elems);
  }, what);
}

TEST(MpiCommunicator, AllgatherOutOfPlaceIsExact) { expect_exact_allgather(false, "allgather out of place"); }

TEST(MpiCommunicator, AllgatherInPlaceIsExact) { expect_exact_allgather(true, "allgather in place"); }

// 16-bit words (a backend's parameter copy) arrive as they were sent, every bit pattern
// included, in place and in pieces; the record counts 2 bytes a word.
TEST(MpiCommunicator, Allgather16BitMovesTheWordsUnchanged) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t send_elems = 1031;
  auto word = [](int owner, size_t i) { return static_cast<uint16_t>((owner * 40503u + i * 7919u) & 0xffffu); };
  for (size_t max_piece : {send_elems, size_t{7}}) {
    comm.set_max_elems_per_call(max_piece);
    std::vector<uint16_t> recv(send_elems * static_cast<size_t>(world_size()), 0xdead);
    uint16_t* own_chunk = recv.data() + static_cast<size_t>(world_rank()) * send_elems;
    for (size_t i = 0; i < send_elems; ++i) own_chunk[i] = word(world_rank(), i);
    comm.finish(comm.start_allgather(collective_args(own_chunk, recv.data(), send_elems, "test")));
    size_t wrong = 0;
    for (size_t i = 0; i < recv.size(); ++i)
      wrong += recv[i] != word(static_cast<int>(i / send_elems), i % send_elems);
    EXPECT_EQ(wrong, 0u) << "16-bit allgather in place, pieces of " << max_piece;
    const std::vector<CollectiveRecord> records = comm.take_records();
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0].kind, CollectiveKind::allgather);
    EXPECT_EQ(records[0].payload_bytes, recv.size() * 2);
  }
}

TEST(MpiCommunicator, BroadcastFromEachRoot) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t elems = 777;
  for (int root = 0; root < world_size(); ++root) {
    std::vector<float> buffer(elems, -1.0f);
    if (world_rank() == root) {
      for (size_t i = 0; i < elems; ++i) buffer[i] = static_cast<float>(root * 1000 + static_cast<int>(i));
    }
    comm.broadcast(buffer.data(), elems, root, "test");
    expect_exact<float>(buffer, [&](size_t i) { return static_cast<float>(root * 1000 + static_cast<int>(i)); },
                        "broadcast from root " + std::to_string(root));
  }
}

TEST(MpiCommunicator, BarrierWaitsForTheLastRank) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const double late_s = 0.3;
  CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  if (world_rank() == 0) std::this_thread::sleep_for(std::chrono::duration<double>(late_s));
  const double begin_s = comm.epoch_seconds_now();
  comm.barrier("test");
  const double waited_s = comm.epoch_seconds_now() - begin_s;
  // Half the delay as margin for ranks leaving the world barrier at slightly different
  // times on an oversubscribed machine.
  if (world_rank() != 0) {
    EXPECT_GE(waited_s, late_s / 2);
  }
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].kind, CollectiveKind::barrier);
  EXPECT_EQ(records[0].payload_bytes, 0u);
}

TEST(MpiCommunicator, CollectivesLargerThanOneCallAreCutIntoPieces) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  // Seven elements per MPI call stand in for INT_MAX: every count below needs several
  // calls, and none is a multiple of seven.
  comm.set_max_elems_per_call(7);
  EXPECT_EQ(comm.max_elems_per_call(), 7u);
  const size_t elems = 52;
  const size_t chunks = static_cast<size_t>(world_size());

  std::vector<float> sum(elems);
  for (size_t i = 0; i < elems; ++i) sum[i] = static_cast<float>((world_rank() + 1) * static_cast<int>(i + 1));
  std::vector<double> sum_double(sum.begin(), sum.end());
  const int root = world_size() - 1;
  std::vector<float> broadcast(elems, -1.0f);
  if (world_rank() == root) for (size_t i = 0; i < elems; ++i) broadcast[i] = static_cast<float>(i * 3);
  const std::vector<float> scatter_send = reduce_scatter_input(elems);
  std::vector<float> scatter_recv(elems, -1.0f);
  std::vector<float> gather_send(elems);
  for (size_t i = 0; i < elems; ++i) gather_send[i] = allgather_value(world_rank(), i);
  std::vector<float> gather_recv(elems * chunks, -1.0f);
  std::vector<float> gather_in_place(elems * chunks, -1.0f);
  float* own_chunk = gather_in_place.data() + static_cast<size_t>(world_rank()) * elems;
  std::copy(gather_send.begin(), gather_send.end(), own_chunk);

  comm.start_allreduce(in_place(sum.data(), elems, "pieces"));
  comm.start_allreduce(in_place(sum_double.data(), elems, "pieces"));
  comm.start_broadcast(in_place(broadcast.data(), elems, "pieces"), root);
  comm.start_reduce_scatter(collective_args(scatter_send.data(), scatter_recv.data(), elems, "pieces"));
  comm.start_allgather(collective_args(gather_send.data(), gather_recv.data(), elems, "pieces"));
  comm.start_allgather(collective_args(own_chunk, gather_in_place.data(), elems, "pieces"));
  // Small values: every partial sum of these is an integer below 256, exact in bf16.
  std::vector<float> sum_bf16(elems);
  for (size_t i = 0; i < elems; ++i)
    sum_bf16[i] = static_cast<float>((world_rank() + 1) * static_cast<int>(i % 7 + 1)) + kBelowBf16;
  std::vector<float> scatter_recv_bf16(elems, -1.0f);
  comm.start_allreduce(in_place(sum_bf16.data(), elems, "pieces", WireType::bf16_from_f32));
  comm.start_reduce_scatter(
      collective_args(scatter_send.data(), scatter_recv_bf16.data(), elems, "pieces", WireType::bf16_from_f32));
  comm.finish_all();

  expect_exact<float>(sum, [](size_t i) { return rank_sum() * static_cast<float>(i + 1); }, "allreduce float in pieces");
  expect_exact<double>(sum_double, [](size_t i) { return static_cast<double>(rank_sum()) * static_cast<double>(i + 1); },
                       "allreduce double in pieces");
  expect_exact<float>(broadcast, [](size_t i) { return static_cast<float>(i * 3); }, "broadcast in pieces");
  expect_exact<float>(scatter_recv, reduce_scatter_expected, "reduce_scatter in pieces");
  expect_exact<float>(sum_bf16, [](size_t i) { return rank_sum() * static_cast<float>(i % 7 + 1); },
                      "allreduce in bf16 in pieces");
  expect_exact<float>(scatter_recv_bf16, reduce_scatter_expected, "reduce_scatter in bf16 in pieces");
  const auto gathered = [&](size_t i) { return allgather_value(static_cast<int>(i / elems), i % elems); };
  expect_exact<float>(gather_recv, gathered, "allgather out of place in pieces");
  expect_exact<float>(gather_in_place, gathered, "allgather in place in pieces");
}

TEST(MpiCommunicator, ManyInFlightFinishedOutOfOrder) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const int rounds = 12;
  const size_t elems = 4096 + 3;
  std::vector<std::vector<float>> sums(rounds, std::vector<float>(elems));
  std::vector<std::vector<float>> broadcasts(rounds, std::vector<float>(elems, -1.0f));
  std::vector<std::vector<float>> gathers(rounds, std::vector<float>(elems * static_cast<size_t>(world_size()), -1.0f));
  std::vector<float> gather_send(elems);
  for (size_t i = 0; i < elems; ++i) gather_send[i] = allgather_value(world_rank(), i);

  std::vector<CommHandle> handles;
  for (int round = 0; round < rounds; ++round) {
    const int root = round % world_size();
    for (size_t i = 0; i < elems; ++i) {
      sums[round][i] = static_cast<float>((world_rank() + 1) * (round + 1));
      if (world_rank() == root) broadcasts[round][i] = static_cast<float>(round * 10 + static_cast<int>(i % 9));
    }
    handles.push_back(comm.start_allreduce(in_place(sums[round].data(), elems, "many")));
    handles.push_back(comm.start_broadcast(in_place(broadcasts[round].data(), elems, "many"), root));
    handles.push_back(comm.start_allgather(collective_args(gather_send.data(), gathers[round].data(), elems, "many")));
    if (round % 4 == 0) handles.push_back(comm.start_barrier("many"));
  }
  // Newest first: finishing a late collective must wait for the earlier ones too.
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) comm.finish(*it);
  // Finishing again, in any order, returns at once.
  comm.finish(handles[handles.size() / 2]);
  comm.finish(handles.front());

  for (int round = 0; round < rounds; ++round) {
    const std::string what = " of round " + std::to_string(round);
    expect_exact<float>(sums[round], [&](size_t) { return rank_sum() * static_cast<float>(round + 1); },
                        "allreduce" + what);
    expect_exact<float>(broadcasts[round], [&](size_t i) { return static_cast<float>(round * 10 + static_cast<int>(i % 9)); },
                        "broadcast" + what);
    expect_exact<float>(gathers[round], [&](size_t i) {
      return allgather_value(static_cast<int>(i / elems), i % elems);
    }, "allgather" + what);
  }
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), handles.size());
  // The newest one's finish covered all the others, which record no wait of their own
  // (the newest records one only if it was still running then).
  for (size_t k = 0; k + 1 < records.size(); ++k)
    EXPECT_TRUE(std::isnan(records[k].wait_begin_s)) << "record " << k << " has a wait of its own";
}

TEST(MpiCommunicator, RecordsComeBackInFifoOrderWithoutOverlap) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t elems = 1 << 16;
  std::vector<float> buffer(elems, 1.0f);
  std::vector<double> buffer_double(elems, 1.0);
  std::vector<float> scatter_recv(elems);
  const std::vector<float> scatter_send(elems * static_cast<size_t>(world_size()), 1.0f);
  std::vector<float> gather_recv(elems * static_cast<size_t>(world_size()));
  const std::vector<CollectiveKind> kinds = {
      CollectiveKind::allreduce, CollectiveKind::barrier, CollectiveKind::broadcast,
      CollectiveKind::reduce_scatter, CollectiveKind::allgather, CollectiveKind::allreduce,
      CollectiveKind::allreduce, CollectiveKind::barrier};
  const double started_s = comm.epoch_seconds_now();
  std::vector<CommHandle> handles;
  for (size_t k = 0; k < kinds.size(); ++k) {
    const std::string phase = "phase-" + std::to_string(k);
    switch (kinds[k]) {
      case CollectiveKind::allreduce:
        handles.push_back(k == 6 ? comm.start_allreduce(in_place(buffer_double.data(), elems, phase))
                                 : comm.start_allreduce(in_place(buffer.data(), elems, phase)));
        break;
      case CollectiveKind::barrier: handles.push_back(comm.start_barrier(phase)); break;
      case CollectiveKind::broadcast:
        handles.push_back(comm.start_broadcast(in_place(buffer.data(), elems, phase), 0));
        break;
      case CollectiveKind::reduce_scatter:
        handles.push_back(
            comm.start_reduce_scatter(collective_args(scatter_send.data(), scatter_recv.data(), elems, phase)));
        break;
      case CollectiveKind::allgather:
        handles.push_back(comm.start_allgather(collective_args(scatter_recv.data(), gather_recv.data(), elems, phase)));
        break;
    }
  }
  for (size_t k = 1; k < handles.size(); ++k) EXPECT_EQ(handles[k].id, handles[k - 1].id + 1);
  comm.finish_all();
  const double finished_s = comm.epoch_seconds_now();

  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), kinds.size());
  for (size_t k = 0; k < records.size(); ++k) {
    EXPECT_EQ(records[k].kind, kinds[k]) << "record " << k;
    EXPECT_EQ(records[k].phase, "phase-" + std::to_string(k));
    EXPECT_LE(records[k].begin_s, records[k].end_s) << "record " << k;
    EXPECT_GE(records[k].begin_s, started_s) << "record " << k;
    EXPECT_LE(records[k].end_s, finished_s) << "record " << k;
    // One comm stream runs one collective at a time.
    if (k > 0) {
      EXPECT_LE(records[k - 1].end_s, records[k].begin_s) << "records " << k - 1 << " and " << k;
    }
  }
  EXPECT_TRUE(comm.take_records().empty()) << "records are handed over once";
}

TEST(MpiCommunicator, PayloadBytesAreCountedPerKind) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  const size_t world = static_cast<size_t>(world_size());
  const size_t elems = 300;
  std::vector<float> buffer(elems * world, 1.0f);
  std::vector<double> buffer_double(elems, 1.0);
  std::vector<float> other(elems * world, 0.0f);

  comm.start_allreduce(in_place(buffer.data(), elems, "bytes"));
  comm.start_allreduce(in_place(buffer_double.data(), elems, "bytes"));
  comm.start_allreduce(in_place(static_cast<float*>(nullptr), 0, "bytes"));
  comm.start_reduce_scatter(collective_args(buffer.data(), other.data(), elems, "bytes"));
  comm.start_allgather(collective_args(other.data(), buffer.data(), elems, "bytes"));
  comm.start_broadcast(in_place(buffer.data(), elems, "bytes"), 0);
  comm.start_barrier("bytes");
  comm.finish_all();

  const std::vector<size_t> expected_record_bytes = {
      elems * 4, elems * 8, 0, elems * world * 4, elems * world * 4, elems * 4, 0};
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), expected_record_bytes.size());
  for (size_t k = 0; k < records.size(); ++k) {
    EXPECT_EQ(records[k].payload_bytes, expected_record_bytes[k]) << "record " << k;
  }

  const std::vector<size_t> by_kind = comm.payload_bytes_by_kind();
  ASSERT_EQ(by_kind.size(), static_cast<size_t>(kCollectiveKindCount));
  EXPECT_EQ(by_kind[static_cast<size_t>(CollectiveKind::allreduce)], elems * 4 + elems * 8);
  EXPECT_EQ(by_kind[static_cast<size_t>(CollectiveKind::reduce_scatter)], elems * world * 4);
  EXPECT_EQ(by_kind[static_cast<size_t>(CollectiveKind::allgather)], elems * world * 4);
  EXPECT_EQ(by_kind[static_cast<size_t>(CollectiveKind::broadcast)], elems * 4);
  EXPECT_EQ(by_kind[static_cast<size_t>(CollectiveKind::barrier)], 0u);
}

TEST(MpiCommunicator, RecordTimesFollowTheEpochAtHandOver) {
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  comm.set_epoch(MpiCommunicator::Clock::now() - std::chrono::seconds(10));
  EXPECT_GE(comm.epoch_seconds_now(), 10.0);
  comm.barrier("before");
  // A new step starts: records of earlier collectives are then measured from it too.
  comm.set_epoch(MpiCommunicator::Clock::now());
  comm.barrier("after");
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_LE(records[0].end_s, 0.0);
  EXPECT_GE(records[1].begin_s, 0.0);
  EXPECT_LT(records[1].end_s, 10.0);
}

// The real thing the comm stream is for. Rank 0 joins the allreduce only after every
// other rank has started it, returned from start_allreduce and begun computing, so on
// those ranks the collective cannot end before the compute began: that part is causal,
// not a matter of timing. (Were start_* to run the collective itself, the other ranks
// would wait in it for rank 0 while rank 0 waits in the barrier for them: a hang.)
TEST(MpiCommunicator, CollectiveOverlapsComputeOnTheMainThread) {
  if (world_size() < 2) GTEST_SKIP() << "overlap needs a peer to wait for";
  MpiCommunicator comm(MPI_COMM_WORLD, kTimeoutS);
  // 256 KiB, as in the other tests here: what is checked does not depend on the size.
  // Under ThreadSanitizer, every 8-byte cell of an Open MPI receive that it takes for a
  // race (which tsan.supp then excuses) goes through its report path, whose cost grows
  // with the cells already seen: at 16 MiB one rank of four spent minutes there, copying a
  // message into this buffer, and the watchdog ended the job.
  const size_t elems = size_t{1} << 16;
  std::vector<float> buffer(elems, static_cast<float>(world_rank() + 1));
  const bool late_rank = world_rank() == 0;

  if (late_rank) CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  const CommHandle handle = comm.start_allreduce(in_place(buffer.data(), elems, "grad-comm"));
  const double compute_begin_s = comm.epoch_seconds_now();
  if (!late_rank) CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  compute_for(comm, 0.25);
  const double compute_end_s = comm.epoch_seconds_now();
  comm.finish(handle);

  expect_exact<float>(buffer, [](size_t) { return rank_sum(); }, "overlapped allreduce");
  const std::vector<CollectiveRecord> records = comm.take_records();
  ASSERT_EQ(records.size(), 1u);
  if (!late_rank) {
    EXPECT_GT(records[0].end_s, compute_begin_s);
    // The comm stream picks the collective up as soon as it is queued; a quarter second
    // of compute leaves a wide margin even with ranks oversubscribing the cores.
    EXPECT_LT(records[0].begin_s, compute_end_s);
  }
}

}  // namespace
}  // namespace scalestudy
