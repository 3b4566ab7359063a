#pragma once
// HDF5's check: a failed call ends the job (core/check.h) with HDF5's error stack.
#include <hdf5.h>

#include <string>

#include "core/check.h"

namespace scalestudy {

// What a failed HDF5 call means for the user, in one line: the file and the OS's message
// where the failure was the OS's (a full disk, a read-only file system), else the
// innermost description on HDF5's error stack.
std::string hdf5_error_string();
// HDF5 prints its whole error stack on every failure unless told not to; the checks
// report one line instead. Called before the first file is opened.
void silence_hdf5_error_printing();

}  // namespace scalestudy

// HDF5 calls return a negative herr_t or hid_t on failure; the value is passed through.
#define CHECK_HDF5(call)                                                                 \
  ([&]() {                                                                               \
    auto check_hdf5_rc_ = (call);                                                        \
    if (check_hdf5_rc_ < 0)                                                              \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, ::scalestudy::hdf5_error_string()); \
    return check_hdf5_rc_;                                                               \
  }())
