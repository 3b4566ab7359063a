#pragma once
// The facts every result file records about where and when it was made.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace scalestudy {

// docs/results-schema.md's version, of run files and benchmark files alike.
inline constexpr int64_t kSchemaVersion = 4;

// ISO-8601 UTC with a Z suffix, e.g. "2026-11-22T03:53:10Z".
std::string utc_now();
std::string host_name();
// The MPI library's version string, first line.
std::string mpi_library_version();
std::string hdf5_library_version();
// Every rank's string, on rank 0 (at most 255 characters each); empty elsewhere.
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int world);

}  // namespace scalestudy
