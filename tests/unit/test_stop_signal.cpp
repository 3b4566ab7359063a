// The stop signals are recorded, not acted on, by their handler: the run stops at its next
// safe point, or a wait ends the job (tests/scripts/test_faults.sh covers those paths).
#include <gtest/gtest.h>
#include <mpi.h>

#include <csignal>

#include "core/control_wait.h"
#include "core/stop_signal.h"

namespace scalestudy {
namespace {

TEST(StopSignal, TheFirstSignalIsRecordedAndNamed) {
  EXPECT_EQ(stop_signal(), 0);
  install_stop_signal_handlers();
  std::raise(SIGUSR1);
  EXPECT_EQ(stop_signal(), SIGUSR1) << "the handler records the signal and returns";
  // A different signal after the first does not replace it: the reason stays the first.
  std::raise(SIGINT);
  EXPECT_EQ(stop_signal(), SIGUSR1);
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(stop_reason(SIGTERM), "terminated by SIGTERM (time limit, scancel or kill)");
  EXPECT_EQ(stop_exit_code(SIGTERM), 143) << "128 + 15, as a shell reports it";
}

TEST(ControlWait, ACompletedCollectiveReturnsItsResult) {
  set_control_timeout(5.0);
  const int mine = 3;
  int sum = 0;
  control_allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF, "test");
  EXPECT_EQ(sum, 3);
  EXPECT_EQ(control_timeout(), 5.0);
}

}  // namespace
}  // namespace scalestudy
