// gather_traces: every rank's kernel trace reaches rank 0 intact, at 1 to 4 ranks, also
// when a rank recorded nothing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "control/mpi_check.h"
#include "profile/kernel_trace.h"

namespace scalestudy {
namespace {

// Rank r records r records (rank 0 none), named and timed after r.
RankTrace trace_of(int rank) {
  RankTrace trace;
  trace.device = "device " + std::to_string(rank);
  trace.origin_ns = 1000 * rank + 7;
  trace.stream_names = {"compute", "comm"};
  for (int i = 0; i < rank; ++i) {
    trace.names.push_back("kernel_" + std::to_string(rank) + "_" + std::to_string(i));
    TraceRecord record;
    record.step = i;
    record.start_ns = 10 * i;
    record.end_ns = 10 * i + rank;
    record.name = i;
    record.stream = i % 2;
    record.grid = {rank, i, 1};
    record.category = static_cast<KernelCategory>(i % kKernelCategoryCount);
    trace.records.push_back(record);
  }
  return trace;
}

TEST(KernelTraceGather, EveryRankArrivesOnRankZero) {
  int rank = 0, size = 1;
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const std::vector<RankTrace> traces = gather_traces(MPI_COMM_WORLD, trace_of(rank));
  if (rank != 0) {
    EXPECT_TRUE(traces.empty());
    return;
  }
  ASSERT_EQ(traces.size(), static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const RankTrace expected = trace_of(r);
    const RankTrace& got = traces[static_cast<size_t>(r)];
    EXPECT_EQ(got.device, expected.device);
    EXPECT_EQ(got.origin_ns, expected.origin_ns);
    EXPECT_EQ(got.names, expected.names);
    EXPECT_EQ(got.stream_names, expected.stream_names);
    ASSERT_EQ(got.records.size(), expected.records.size());
    for (size_t i = 0; i < got.records.size(); ++i) {
      EXPECT_EQ(got.records[i].end_ns, expected.records[i].end_ns);
      EXPECT_EQ(got.records[i].grid, expected.records[i].grid);
      EXPECT_EQ(got.records[i].category, expected.records[i].category);
      EXPECT_EQ(got.records[i].stream, expected.records[i].stream);
    }
  }
}

}  // namespace
}  // namespace scalestudy
