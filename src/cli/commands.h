#pragma once
// The subcommands of the scalestudy binary. Each returns the process exit code and
// throws UsageError for bad input (main turns it into exit code 2).
namespace scalestudy {

int run_train_command(int argc, const char* const* argv);
int run_info_command(int argc, const char* const* argv);
int run_bench_command(int argc, const char* const* argv);

}  // namespace scalestudy
