#pragma once
// MPI's check, and the MPI calls by which a failed check ends the whole job (the ground's
// JobEnder, core/check.h): the job-end notice that tells the other ranks why, and
// MPI_Abort.
#include <mpi.h>

#include <string>

#include "core/check.h"

namespace scalestudy {

std::string mpi_error_string(int code);

// Lends the ground the MPI calls of ending a job; MpiRuntime calls it before MPI starts.
void install_mpi_job_ender();

}  // namespace scalestudy

#define CHECK_MPI(call) SCALESTUDY_CHECK_RESULT(call, MPI_SUCCESS, ::scalestudy::mpi_error_string)
