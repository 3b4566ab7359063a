#pragma once
// The facts every result file records about where and when it was made.
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "results/output_lock.h"

namespace scalestudy {

// docs/results-schema.md's version, of run files and benchmark files alike.
inline constexpr int64_t kSchemaVersion = 8;

// ISO-8601 UTC with a Z suffix, e.g. "2026-11-22T03:53:10Z".
std::string utc_now();
// The MPI library's version string, first line.
std::string mpi_library_version();
std::string hdf5_library_version();
// Every rank's string, on rank 0 (at most 255 characters each); empty elsewhere.
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int world);

// What a run or benchmark records about itself and this rank's device; the backend's
// setup fills it, and the command adds argv.
struct RunIdentity {
  std::vector<std::string> argv;
  std::string backend;      // "cpu" or "cuda"
  std::string device_name;  // this rank's: "cpu" or the GPU's name
  // This rank's GPU as nvidia-smi names it: "GPU-<uuid>" and "<domain>:<bus>:<device>.0";
  // empty on the cpu backend. They tell two GPUs of one model apart, across nodes too.
  std::string device_uuid;
  std::string device_pci_bus_id;
  double peak_tflops_per_gpu = 0.0;  // NaN when unknown (the CPU)
  std::string peak_source = "none";
  std::string cuda_version = "none";
  std::string nccl_version = "none";
  // --link-emulation: "none" or "socket" (comm/nccl_transport.h).
  std::string link_emulation = "none";
  // The transports NCCL connected this rank through, as it logged them ("P2P",
  // "NET/Socket", ...); "none" without NCCL or peers; "unknown" where NCCL's log was not
  // readable.
  std::string nccl_transports = "none";
  // The NCCL_* variables in effect when NCCL started, one NAME=VALUE per line, sorted.
  std::string nccl_environment;
};

// Where each rank runs, gathered from every rank onto rank 0 (empty elsewhere).
struct RankPlacement {
  std::vector<std::string> hosts;
  std::vector<int64_t> node_indices;       // MPI's node of the rank (comm/mpi_runtime.h)
  std::vector<int64_t> local_ranks;        // MPI's rank among its node's, which picks the GPU
  std::vector<std::string> devices;        // "cpu" or the GPU's name
  std::vector<std::string> device_uuids;   // "" on the cpu
  std::vector<std::string> device_pci_bus_ids;
  std::vector<int64_t> logical_cores;      // the host's online logical CPUs
  std::vector<std::string> cpu_bindings;   // the CPUs the rank may run on, e.g. "0-3,8"
  std::vector<std::string> cpu_models;     // the host's CPU model name
  std::vector<std::string> nccl_transports;  // RunIdentity::nccl_transports
};
// One run's transports from its ranks': "unknown" where any rank's is, else the union of
// the ranks' lists ("NET/Socket,P2P"), "none" when no rank connected through any.
std::string run_transports(const std::vector<std::string>& rank_transports);
// This process's CPU affinity as a list of ranges, e.g. "0-3,8".
std::string cpu_binding();
// The model name of this host's CPUs (/proc/cpuinfo), or "unknown".
std::string cpu_model();
// Collective over comm: every rank passes its own identity, and MPI places it.
RankPlacement gather_rank_placement(MPI_Comm comm, const RunIdentity& identity);

// The header that run files and benchmark files share (docs/results-schema.md).
struct ProvenanceHeader {
  std::vector<std::string> argv;
  std::string backend;    // "cpu" or "cuda"
  std::string precision;  // "fp32", "bf16" or "fp16"
  std::string cuda_version = "none";
  std::string nccl_version = "none";
  std::string link_emulation = "none";
  std::string nccl_environment;  // rank 0's
  RankPlacement ranks;
};
// The header's fields that come from the identity of rank 0 and every rank's placement.
ProvenanceHeader provenance_header(const RunIdentity& identity, const std::string& precision, MPI_Comm comm);
// Creates OUTPUT.partial, the name a result file has until it is complete or failed (its
// folder too), saying so where a stale one is replaced; HDF5 prints no error stacks from
// here on (the checks report one line). Only the holder of the output's lock may.
hid_t create_partial_file(const OutputLock& lock);

// Writes the root's provenance attributes (schema version, build, argv, start time, world
// size, nodes and ranks per node, backend, precision, library versions), the status
// "running" with an empty failure reason and end time, the links (link_emulation, NCCL's
// transports and environment), and /ranks (docs/results-schema.md).
void write_provenance_header(hid_t root, const ProvenanceHeader& header);

}  // namespace scalestudy
