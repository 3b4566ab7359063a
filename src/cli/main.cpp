// scalestudy: one binary, one subcommand per job.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "comm/mpi_runtime.h"
#include "build_info.h"
#include "core/check.h"
#include "core/usage_error.h"

namespace {

const char* kUsage =
    "Usage: scalestudy <command> [options]\n"
    "\n"
    "Commands:\n"
    "  train        train a GPT-style transformer data-parallel over the MPI ranks, timing every phase\n"
    "  info         print the model presets with their parameter counts and FLOPs per token\n"
    "  bench        micro-benchmarks: gemm, bandwidth, layer, inference, comm (results in HDF5)\n"
    "  gemm-search  the file of GEMM algorithms that train --gemm-algos-file reads, chosen on one GPU\n"
    "\n"
    "'scalestudy <command> --help' describes a command's options.\n";

// Every rank parses the same arguments, so every rank meets the same usage error, and
// rank 0 reports it. The others wait for rank 0 (a bounded while, in case the error was
// theirs alone) so that the launcher does not tear rank 0 down before it has printed.
void wait_for_rank0_report() {
  int started = 0;
  MPI_Initialized(&started);
  if (!started) return;
  MPI_Request request;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &request) != MPI_SUCCESS) return;
  const double deadline = MPI_Wtime() + 10.0;
  int done = 0;
  while (!done && MPI_Wtime() < deadline) {
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    if (!done) usleep(1000);
  }
}

}  // namespace

namespace scalestudy {

bool runs_without_mpi(int argc, const char* const* argv) {
  if (argc < 2) return false;
  const std::string command = argv[1];
  if (command == "info" || command == "gemm-search") return true;
  // Boost reads every "--check" token as the switch: no option takes a value that starts with "--".
  return command == "train" && std::any_of(argv + 2, argv + argc, [](const char* arg) {
           return std::strcmp(arg, "--check") == 0;
         });
}

int rank_in_world() {
  int started = 0, rank = 0;
  MPI_Initialized(&started);
  if (started) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace scalestudy

using scalestudy::rank_in_world;

int main(int argc, char** argv) {
  std::optional<scalestudy::MpiRuntime> mpi;
  if (!scalestudy::runs_without_mpi(argc, argv)) mpi.emplace(&argc, &argv);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    if (rank_in_world() == 0) std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? scalestudy::kUsageExitCode : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    if (rank_in_world() == 0) std::printf("scalestudy %s (git %s)\n", SCALESTUDY_VERSION, SCALESTUDY_GIT_SHA);
    return 0;
  }
  const std::string command = argv[1];
  try {
    if (command == "train") return scalestudy::run_train_command(argc - 1, argv + 1);
    if (command == "info") return scalestudy::run_info_command(argc - 1, argv + 1);
    if (command == "bench") return scalestudy::run_bench_command(argc - 1, argv + 1);
    if (command == "gemm-search") return scalestudy::run_gemm_search_command(argc - 1, argv + 1);
    throw scalestudy::UsageError("unknown command '" + command + "' (see scalestudy --help)");
  } catch (const scalestudy::UsageError& error) {
    // Every rank parsed the same arguments, so every rank ends here; one reports it.
    if (rank_in_world() == 0) {
      std::fprintf(stderr, "scalestudy %s: error: %s\n", scalestudy::one_line(command).c_str(),
                   scalestudy::one_line(error.what()).c_str());
      std::fflush(stderr);
    }
    wait_for_rank0_report();
    return scalestudy::kUsageExitCode;
  } catch (const std::exception& error) {
    // A failure on one rank would leave its peers waiting in a collective: end the job.
    scalestudy::abort_job(__FILE__, __LINE__, "scalestudy " + command + " failed", error.what());
  }
}
