#include "comm/mpi_runtime.h"

#include <string>
#include <vector>

#include "control/mpi_check.h"
#include "control/peer_processes.h"
#include "control/roll_call.h"

namespace scalestudy {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  // Before MPI starts: a check that fails from here on ends the whole job.
  install_mpi_job_ender();
  int initialized = 0;
  CHECK_MPI(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    // Someone else started MPI; the level they asked for still has to be enough.
    CHECK_MPI(MPI_Query_thread(&provided));
  } else {
    CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  }
  // The default handler (MPI_ERRORS_ARE_FATAL) would abort inside MPI with its own
  // message, before CHECK_MPI could name the rank, the call and the source line.
  // Communicators duplicated from the world inherit this handler.
  CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  if (provided < MPI_THREAD_MULTIPLE) {
    abort_job(__FILE__, __LINE__, "MPI_Init_thread",
              std::string("the MPI library granted ") + thread_level_name(provided) +
                  ", but scalestudy needs MPI_THREAD_MULTIPLE: its comm stream is a thread "
                  "that calls MPI while the main thread may too. Use an MPI build with "
                  "thread support (Open MPI: ompi_info | grep MPI_THREAD_MULTIPLE)");
  }
  // From here on this rank answers roll calls (control/roll_call.h), whatever it is doing.
  start_roll_call_responder();
  // So that a rank stopped by SIGTERM can tell whether a peer on its host ended first.
  record_peer_processes();
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  stop_roll_call_responder();
  CHECK_MPI(MPI_Finalize());
}

NodeSplit split_by_node(MPI_Comm comm) {
  int rank = 0;
  CHECK_MPI(MPI_Comm_rank(comm, &rank));
  // Keyed by rank so that local ranks follow global order within a node, and the leaders
  // number the nodes in order of their lowest rank.
  NodeSplit split;
  CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &split.node));
  int local_rank = 0;
  CHECK_MPI(MPI_Comm_rank(split.node, &local_rank));
  CHECK_MPI(MPI_Comm_split(comm, local_rank == 0 ? 0 : MPI_UNDEFINED, rank, &split.leaders));
  return split;
}

void free_node_split(NodeSplit& split) {
  if (split.leaders != MPI_COMM_NULL) CHECK_MPI(MPI_Comm_free(&split.leaders));
  if (split.node != MPI_COMM_NULL) CHECK_MPI(MPI_Comm_free(&split.node));
}

NodeRanks node_ranks(MPI_Comm comm) {
  NodeSplit split = split_by_node(comm);
  NodeRanks node;
  CHECK_MPI(MPI_Comm_rank(split.node, &node.local_rank));
  CHECK_MPI(MPI_Comm_size(split.node, &node.local_size));
  // Each node's first rank tells the ranks of its node where the node stands among them.
  int index_and_count[2] = {0, 0};
  if (split.leaders != MPI_COMM_NULL) {
    CHECK_MPI(MPI_Comm_rank(split.leaders, &index_and_count[0]));
    CHECK_MPI(MPI_Comm_size(split.leaders, &index_and_count[1]));
  }
  CHECK_MPI(MPI_Bcast(index_and_count, 2, MPI_INT, 0, split.node));
  node.node_index = index_and_count[0];
  node.node_count = index_and_count[1];
  free_node_split(split);
  return node;
}

ProcessPlacement discover_placement(MPI_Comm comm) {
  ProcessPlacement placement;
  CHECK_MPI(MPI_Comm_rank(comm, &placement.rank));
  CHECK_MPI(MPI_Comm_size(comm, &placement.world_size));

  const NodeRanks node = node_ranks(comm);
  placement.local_rank = node.local_rank;
  placement.local_size = node.local_size;
  placement.node_index = node.node_index;
  placement.node_count = node.node_count;

  std::vector<char> host(MPI_MAX_PROCESSOR_NAME + 1, '\0');
  int host_chars = 0;
  CHECK_MPI(MPI_Get_processor_name(host.data(), &host_chars));
  placement.host.assign(host.data(), static_cast<size_t>(host_chars));
  return placement;
}

}  // namespace scalestudy
