// GoogleTest main for every test executable: MPI is initialised once per process (the
// code under test uses it even on one rank), and only rank 0 prints results so that a
// 4-rank run reads like a 1-rank one. A failure on any rank fails the process.
#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_runtime.h"

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
