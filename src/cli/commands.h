#pragma once
// The subcommands of the scalestudy binary. Each returns the process exit code and
// throws UsageError for bad input (main turns it into exit code 2).
namespace scalestudy {

int run_train_command(int argc, const char* const* argv);
int run_info_command(int argc, const char* const* argv);
int run_bench_command(int argc, const char* const* argv);
int run_gemm_search_command(int argc, const char* const* argv);

// Whether the command line asks for what runs no ranks (`info`, `gemm-search` on one GPU,
// `train --check`), which the binary then does without starting MPI: a sweep asks
// `train --check` of every point, quickly.
bool runs_without_mpi(int argc, const char* const* argv);
// This process's rank in MPI_COMM_WORLD, or 0 where MPI was not started.
int rank_in_world();

}  // namespace scalestudy
