// A job in which the last rank never joins a collective that the others start, as a hung
// peer would not: the collective watchdog must end it once the timeout has passed, with a
// message naming the rank, the collective and its phase. Run by tests/scripts/test_faults.sh
// (its part comm_timeout) as `stuck_collective TIMEOUT_S` under mpiexec.
// `stuck_collective TIMEOUT_S startup` blocks the others in a barrier under a
// BlockingCallDeadline instead, as a peer that never reaches the start-up's node split
// would (control/control_wait.h).
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "control/control_wait.h"

int main(int argc, char** argv) {
  scalestudy::MpiRuntime mpi(&argc, &argv);
  const double timeout_s = argc > 1 ? std::atof(argv[1]) : 2.0;
  scalestudy::MpiCommunicator comm(MPI_COMM_WORLD, timeout_s);
  if (comm.rank() == comm.world_size() - 1) {
    // Ended by the others' MPI_Abort; the sleep only bounds a job whose watchdog failed.
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  }
  if (argc > 2 && std::strcmp(argv[2], "startup") == 0) {
    scalestudy::set_control_timeout(timeout_s);
    const scalestudy::BlockingCallDeadline deadline("the test's start-up barrier", comm.rank());
    MPI_Barrier(MPI_COMM_WORLD);
    return 0;
  }
  std::vector<float> gradients(1024, 1.0f);
  comm.allreduce(gradients.data(), gradients.size(), "grad-comm");
  return 0;
}
