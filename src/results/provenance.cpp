#include "results/provenance.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <ctime>

#include "results/hdf5_check.h"

namespace scalestudy {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string host_name() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  CHECK_MPI(MPI_Get_library_version(text, &length));
  std::string version(text, static_cast<size_t>(length));
  return version.substr(0, version.find_first_of("\r\n"));
}

std::string hdf5_library_version() {
  unsigned major = 0, minor = 0, release = 0;
  CHECK_HDF5(H5get_libversion(&major, &minor, &release));
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int world) {
  constexpr int kSlot = 256;
  std::array<char, kSlot> slot{};
  std::copy_n(mine.begin(), std::min<size_t>(mine.size(), kSlot - 1), slot.begin());
  std::vector<char> all(static_cast<size_t>(kSlot) * world);
  CHECK_MPI(MPI_Gather(slot.data(), kSlot, MPI_CHAR, all.data(), kSlot, MPI_CHAR, 0, comm));
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) out.emplace_back(all.data() + static_cast<size_t>(r) * kSlot);
  return out;
}

}  // namespace scalestudy
