#pragma once
// HDF5's check: a failed call ends the job (core/check.h) with HDF5's error stack.
#include <hdf5.h>

#include <string>

#include "core/check.h"

namespace scalestudy {

// The descriptions on HDF5's error stack, innermost last, joined by "; ".
std::string hdf5_error_string();

}  // namespace scalestudy

// HDF5 calls return a negative herr_t or hid_t on failure; the value is passed through.
#define CHECK_HDF5(call)                                                                 \
  ([&]() {                                                                               \
    auto check_hdf5_rc_ = (call);                                                        \
    if (check_hdf5_rc_ < 0)                                                              \
      ::scalestudy::abort_job(__FILE__, __LINE__, #call, ::scalestudy::hdf5_error_string()); \
    return check_hdf5_rc_;                                                               \
  }())
