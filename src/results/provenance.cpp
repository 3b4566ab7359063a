#include "results/provenance.h"

#include <hdf5.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "build_info.h"
#include "comm/mpi_runtime.h"
#include "control/control_wait.h"
#include "control/mpi_check.h"
#include "results/hdf5_check.h"
#include "results/hdf5_io.h"

namespace scalestudy {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
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
  control_gather(slot.data(), kSlot, MPI_CHAR, all.data(), 0, comm, "provenance");
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) out.emplace_back(all.data() + static_cast<size_t>(r) * kSlot);
  return out;
}

std::string cpu_binding() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "unknown";
  std::string ranges;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    ranges += (ranges.empty() ? "" : ",") + std::to_string(cpu) + (last > cpu ? "-" + std::to_string(last) : "");
    cpu = last;
  }
  return ranges;
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "unknown";
}

RankPlacement gather_rank_placement(MPI_Comm comm, const RunIdentity& identity) {
  const ProcessPlacement where = discover_placement(comm);
  const int world = where.world_size;
  const bool root = where.rank == 0;
  RankPlacement placement{.hosts = gather_strings(comm, host_name(), world),
                          .node_indices = std::vector<int64_t>(root ? world : 0),
                          .local_ranks = std::vector<int64_t>(root ? world : 0),
                          .devices = gather_strings(comm, identity.device_name, world),
                          .device_uuids = gather_strings(comm, identity.device_uuid, world),
                          .device_pci_bus_ids = gather_strings(comm, identity.device_pci_bus_id, world),
                          .logical_cores = std::vector<int64_t>(root ? world : 0),
                          .cpu_bindings = gather_strings(comm, cpu_binding(), world),
                          .cpu_models = gather_strings(comm, cpu_model(), world),
                          .nccl_transports = gather_strings(comm, identity.nccl_transports, world)};
  const int64_t node_index = where.node_index, local_rank = where.local_rank;
  const int64_t cores = sysconf(_SC_NPROCESSORS_ONLN);
  control_gather(&node_index, 1, MPI_INT64_T, placement.node_indices.data(), 0, comm, "provenance");
  control_gather(&local_rank, 1, MPI_INT64_T, placement.local_ranks.data(), 0, comm, "provenance");
  control_gather(&cores, 1, MPI_INT64_T, placement.logical_cores.data(), 0, comm, "provenance");
  return placement;
}

std::string run_transports(const std::vector<std::string>& rank_transports) {
  std::set<std::string> all;
  for (const std::string& list : rank_transports) {
    if (list == "unknown") return list;
    std::istringstream parts(list);
    std::string part;
    while (std::getline(parts, part, ','))
      if (!part.empty() && part != "none") all.insert(part);
  }
  std::string joined;
  for (const std::string& transport : all) joined += (joined.empty() ? "" : ",") + transport;
  return joined.empty() ? "none" : joined;
}

ProvenanceHeader provenance_header(const RunIdentity& identity, const std::string& precision, MPI_Comm comm) {
  return ProvenanceHeader{.argv = identity.argv,
                          .backend = identity.backend,
                          .precision = precision,
                          .cuda_version = identity.cuda_version,
                          .nccl_version = identity.nccl_version,
                          .link_emulation = identity.link_emulation,
                          .nccl_environment = identity.nccl_environment,
                          .ranks = gather_rank_placement(comm, identity)};
}

hid_t create_partial_file(const OutputLock& lock) {
  silence_hdf5_error_printing();
  const std::string& output = lock.output();
  const std::filesystem::path parent = std::filesystem::path(output).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  const std::string partial = output + ".partial";
  std::error_code error;
  if (std::filesystem::exists(partial, error))
    std::fprintf(stderr, "scalestudy: replacing %s, left by a run that did not finish\n", partial.c_str());
  return CHECK_HDF5(H5Fcreate(partial.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
}

void write_provenance_header(hid_t root, const ProvenanceHeader& header) {
  std::string argv;
  for (const auto& arg : header.argv) argv += (argv.empty() ? "" : " ") + arg;
  // Nodes as MPI placed the ranks: the node indices count them, and the fullest holds
  // the ranks per node.
  std::map<int64_t, int64_t> ranks_by_node;
  for (const int64_t node : header.ranks.node_indices) ++ranks_by_node[node];
  int64_t ranks_per_node = 0;
  for (const auto& [node, count] : ranks_by_node) ranks_per_node = std::max(ranks_per_node, count);

  h5::set_attribute(root, "schema_version", kSchemaVersion);
  h5::set_attribute(root, "scalestudy_version", SCALESTUDY_VERSION);
  h5::set_attribute(root, "git_sha", SCALESTUDY_GIT_SHA);
  const std::string sha = SCALESTUDY_GIT_SHA;
  const std::string dirty_suffix = "-dirty";
  const bool dirty = sha.size() > dirty_suffix.size() &&
                     sha.compare(sha.size() - dirty_suffix.size(), dirty_suffix.size(), dirty_suffix) == 0;
  h5::set_attribute(root, "git_dirty", static_cast<int64_t>(dirty));
  h5::set_attribute(root, "argv", argv);
  h5::set_attribute(root, "start_time", utc_now());
  h5::set_attribute(root, "end_time", "");
  h5::set_attribute(root, "world_size", static_cast<int64_t>(header.ranks.hosts.size()));
  h5::set_attribute(root, "nodes", static_cast<int64_t>(ranks_by_node.size()));
  h5::set_attribute(root, "ranks_per_node", ranks_per_node);
  h5::set_attribute(root, "backend", header.backend);
  h5::set_attribute(root, "precision", header.precision);
  h5::set_attribute(root, "status", "running");
  h5::set_attribute(root, "failure_reason", "");
  h5::set_attribute(root, "cuda_version", header.cuda_version);
  h5::set_attribute(root, "nccl_version", header.nccl_version);
  h5::set_attribute(root, "link_emulation", header.link_emulation);
  h5::set_attribute(root, "nccl_transports", run_transports(header.ranks.nccl_transports));
  h5::set_attribute(root, "nccl_environment", header.nccl_environment);
  h5::set_attribute(root, "mpi_version", mpi_library_version());
  h5::set_attribute(root, "hdf5_version", hdf5_library_version());
  h5::Handle ranks = h5::create_group(root, "ranks");
  h5::write_strings(ranks.get(), "hostname", header.ranks.hosts);
  h5::write_strings(ranks.get(), "device", header.ranks.devices);
  h5::write_strings(ranks.get(), "device_uuid", header.ranks.device_uuids);
  h5::write_strings(ranks.get(), "device_pci_bus_id", header.ranks.device_pci_bus_ids);
  const hsize_t world = header.ranks.hosts.size();
  h5::write_int64(ranks.get(), "node_index", {world}, header.ranks.node_indices);
  h5::write_int64(ranks.get(), "local_rank", {world}, header.ranks.local_ranks);
  h5::write_int64(ranks.get(), "logical_cores", {world}, header.ranks.logical_cores);
  h5::write_strings(ranks.get(), "cpu_binding", header.ranks.cpu_bindings);
  h5::write_strings(ranks.get(), "cpu_model", header.ranks.cpu_models);
  // An attribute, not a dataset: a further dataset in /ranks moves the file's metadata so
  // that a disk filling during the steps leaves steps HDF5 cannot read back
  // (tests/scripts/test_faults.sh, disk-full).
  h5::set_attribute(ranks.get(), "nccl_transports", header.ranks.nccl_transports);
}

}  // namespace scalestudy
