#include "train/consistency.h"

#include <string>
#include <vector>

#include "control/mpi_check.h"
#include "control/control_wait.h"

namespace scalestudy {
namespace {

// Returns the first rank whose value differs from rank 0's, or -1.
int first_rank_differing(MPI_Comm comm, uint64_t value, const std::string& phase) {
  int world = 1;
  CHECK_MPI(MPI_Comm_size(comm, &world));
  std::vector<uint64_t> all(static_cast<size_t>(world));
  control_allgather(&value, 1, MPI_UINT64_T, all.data(), comm, phase);
  for (int r = 1; r < world; ++r)
    if (all[static_cast<size_t>(r)] != all[0]) return r;
  return -1;
}

}  // namespace

uint64_t checksum_bytes(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

void check_same_config(MPI_Comm comm, const std::vector<std::pair<std::string, std::string>>& described) {
  std::string all;
  for (const auto& [key, value] : described) all += key + "=" + value + "\n";
  const int rank = first_rank_differing(comm, checksum_bytes(all.data(), all.size()), "configuration check");
  if (rank < 0) return;
  // Every rank compares each option's value with rank 0's, one collective per option, in
  // the order every rank lists them.
  std::string differing = "(the number of options)";
  for (const auto& [key, value] : described) {
    if (first_rank_differing(comm, checksum_bytes(value.data(), value.size()), "configuration check") >= 0) {
      differing = key + " (/config/" + key + " in a result file)";
      break;
    }
  }
  end_job("configuration mismatch: rank " + std::to_string(rank) + " resolved " + differing +
              " differently from rank 0; start every rank with the same options",
          2);
}

void check_replicas(MPI_Comm comm, uint64_t checksum, int step) {
  const int rank = first_rank_differing(comm, checksum, "replica check");
  if (rank >= 0)
    abort_job(__FILE__, __LINE__, "replica check failed",
              "after step " + std::to_string(step) + " the parameters of rank " + std::to_string(rank) +
                  " differ from rank 0's");
}

}  // namespace scalestudy
