#include "train/consistency.h"

#include <string>
#include <vector>

#include "core/check.h"
#include "core/control_wait.h"

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

void check_same_config(MPI_Comm comm, uint64_t config_hash) {
  const int rank = first_rank_differing(comm, config_hash, "configuration check");
  if (rank >= 0)
    abort_job(__FILE__, __LINE__, "configuration mismatch",
              "rank " + std::to_string(rank) + " resolved a different configuration than rank 0; "
              "start every rank with the same options",
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
