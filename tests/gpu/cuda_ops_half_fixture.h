#pragma once
// The name under which dev/op_timings.cpp includes the op tests' fixture
// (cuda_ops_fixture.h, which serves every precision), with the storage's name as it calls
// it. The tests include cuda_ops_fixture.h.
#include "cuda_ops_fixture.h"

namespace scalestudy::gpu_test {

inline const char* storage_name(Precision precision) { return precision_name(precision); }

}  // namespace scalestudy::gpu_test
