#pragma once
// Checks that every rank runs the same thing, over the MPI control plane.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace scalestudy {

// Ends the job (exit code 2) when any rank's resolved configuration differs from rank 0's,
// naming the first such rank and the first option that differs: ranks started with
// different options would otherwise deadlock or silently train different models.
void check_same_config(MPI_Comm comm, const std::vector<std::pair<std::string, std::string>>& described);

// Ends the job when any rank's parameter checksum differs from rank 0's, naming the
// first such rank and the step. Replicas must stay bitwise identical.
void check_replicas(MPI_Comm comm, uint64_t checksum, int step);

uint64_t checksum_bytes(const void* data, size_t bytes);

}  // namespace scalestudy
