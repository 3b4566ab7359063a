#pragma once
// MPI start-up and the facts about this process's place in the job.
#include <mpi.h>

#include <string>

namespace scalestudy {

struct ProcessPlacement {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes of this node
  int local_size = 1;
  int node_index = 0;        // this node among the job's, numbered in order of their lowest rank
  int node_count = 1;
  std::string host;
};

// Initialises MPI with MPI_THREAD_MULTIPLE (the comm stream is a thread of its own that
// calls MPI while the main thread may too) and fails clearly if it is not granted.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
};

// Node-local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): right under srun and
// mpirun alike, whichever of SLURM_LOCALID and OMPI_COMM_WORLD_LOCAL_RANK is set. A node
// is one such shared-memory domain, so the node index and count are MPI's too, whatever
// the hosts are called. Collective over comm.
ProcessPlacement discover_placement(MPI_Comm comm);

// This rank's place among the ranks of `comm` on its node, how many they are, and its
// node among the nodes (the same split as discover_placement's). Collective over `comm`.
struct NodeRanks {
  int local_rank = 0;
  int local_size = 1;
  int node_index = 0;  // nodes numbered in order of their lowest rank
  int node_count = 1;
};
NodeRanks node_ranks(MPI_Comm comm);

// The two communicators of that split: `node` holds the ranks of this rank's node, keyed
// by rank; `leaders` holds each node's first rank, keyed by rank, and is MPI_COMM_NULL on
// the other ranks. Collective over `comm`; the caller frees both (free_node_split).
struct NodeSplit {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm leaders = MPI_COMM_NULL;
};
NodeSplit split_by_node(MPI_Comm comm);
void free_node_split(NodeSplit& split);

}  // namespace scalestudy
