#pragma once
// The control plane's collectives (the loss, the per-step record gathers, the start-up
// checks, the stop agreement) are started with MPI's nonblocking calls and waited for
// here, so that no rank waits past the timeout for a peer that is stuck or gone, and a
// stop signal ends a wait at once (core/stop_signal.h).
#include <mpi.h>

#include <string>

namespace scalestudy {

// The longest a control-plane collective may take (--comm-timeout); 300 s until set.
void set_control_timeout(double seconds);
double control_timeout();

// Waits for `request`. A stop signal ends the job through end_job_for_signal; a wait past
// control_timeout() ends it with a message naming the collective and the phase.
void wait_control(MPI_Request& request, const char* collective, const std::string& phase);

// The blocking forms that the control plane uses, each as its nonblocking call and
// wait_control.
void control_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op,
                       MPI_Comm comm, const std::string& phase);
void control_gather(const void* send, int count, MPI_Datatype type, void* recv, int root,
                    MPI_Comm comm, const std::string& phase);
void control_gatherv(const void* send, int count, MPI_Datatype type, void* recv, const int* counts,
                     const int* offsets, int root, MPI_Comm comm, const std::string& phase);
void control_allgather(const void* send, int count, MPI_Datatype type, void* recv, MPI_Comm comm,
                       const std::string& phase);
void control_barrier(MPI_Comm comm, const std::string& phase);

}  // namespace scalestudy
