#pragma once
// `scalestudy bench comm`: allreduce, reduce-scatter and allgather through the job's
// communicator (NCCL on cuda, MPI on the cpu), for payloads from 1 KiB to 1 GiB by
// default, doubling. Reported as nccl-tests does (doc/PERFORMANCE.md in
// github.com/NVIDIA/nccl-tests), where the size of a collective is its full buffer:
//   algbw = payload bytes / time
//   busbw = algbw × factor, factor = 2(n−1)/n (allreduce), (n−1)/n (reduce-scatter,
//           allgather), n ranks
// so that busbw is comparable with the hardware's bus bandwidth whatever n is.
//
// Every point is checked: before it is timed, one collective runs on inputs whose sums
// are exact in fp32 (small integers), and every element of every rank's result is
// compared bit for bit; the wrong elements of all ranks are counted. The timed calls
// then run on zeroed buffers, whose in-place sums stay zero however often they repeat.
// A sample's time is the slowest rank's.
//
// Scopes. Each collective runs over up to three communicators, each a scope of its own
// rows (--scopes):
//   world       every rank of the job (the job's communicator);
//   intra_node  the ranks of one node, every node's at once (the node split of
//               comm/mpi_runtime.h); each node's link is its own, so the nodes do not
//               share bandwidth, and a sample is the slowest node's;
//   inter_node  one rank per node, the node's first; the others wait, so its traffic has
//               the inter-node link to itself.
// A sub-scope's communicator is the backend's (MPI on the cpu, NCCL on cuda), built over
// the scope's ranks. A scope of one rank per communicator (one node, one rank per node),
// or with nodes of unequal rank counts, is not measured: the file records it as absent,
// with the reason, and holds no rows for it.
#include <cstddef>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "comm/communicator.h"

namespace scalestudy {

inline const std::vector<std::string> kCommCollectives = {"allreduce", "reduce_scatter", "allgather"};
inline const std::vector<std::string> kCommScopes = {"world", "intra_node", "inter_node"};
CollectiveKind comm_collective_kind(const std::string& name);

// nccl-tests' bus-bandwidth factor of a collective over world_size ranks.
double bus_bandwidth_factor(CollectiveKind kind, int world_size);

// Elements of the payload for about `bytes` bytes of fp32: rounded down to a multiple of
// the world size (reduce-scatter and allgather split it evenly), at least one per rank.
size_t comm_payload_elems(int64_t bytes, int world_size);

// The exact inputs: element i of rank r's send buffer is (r + 1)·(1 + i mod 251). Every
// partial sum is an integer below 2^24, so exact in fp32 in any order, up to 364 ranks.
float comm_input(int rank, size_t index);
// Elements of `result` (this rank's receive buffer) that differ from the exact answer;
// payload_elems is the full buffer the collective covers.
size_t count_wrong_elems(CollectiveKind kind, int rank, int world_size, size_t payload_elems,
                         const std::vector<float>& result);

void run_comm_bench(BenchContext& context);

}  // namespace scalestudy
