// GoogleTest main for every test executable: MPI is initialised once per process (the
// code under test uses it even on one rank), and only rank 0 prints results so that a
// 4-rank run reads like a 1-rank one. A failure on any rank fails the process.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_runtime.h"

// The sanitizer builds' options, compiled into every test executable, so that they hold
// wherever it runs: under ctest, and when the build lists an executable's tests. Leaks are
// not checked, because Open MPI keeps what MPI_Init allocates and unloads its components
// before the check; one test asks for an impossible allocation on purpose. What
// ThreadSanitizer cannot see inside Open MPI is suppressed in tests/tsan.supp, each entry
// with its reason; history_size=7 keeps the stacks those entries match. A variable of the
// environment (ASAN_OPTIONS, TSAN_OPTIONS) still overrides these.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_options() { return "detect_leaks=0:allocator_may_return_null=1"; }
#endif
#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_options() {
  return "suppressions=" SCALESTUDY_SOURCE_DIR "/tests/tsan.supp halt_on_error=1 history_size=7";
}
#endif

int main(int argc, char** argv) {
  scalestudy::MpiRuntime mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed ? 1 : 0;
}
