#include "comm/bf16_wire_staging.h"

#if SCALESTUDY_HAVE_CUDA
#include <string>

#include "core/memory_estimate.h"
#include "cuda_check.h"
#include "elementwise.cuh"

namespace scalestudy {

Bf16WireStaging::~Bf16WireStaging() { cudaFree(buffer_); }

void Bf16WireStaging::reserve(size_t elems) {
  if (elems <= elems_) return;
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  CHECK_CUDA(cudaFree(buffer_));
  buffer_ = nullptr;
  elems_ = 0;
  const cudaError_t rc = cudaMalloc(&buffer_, elems * sizeof(__nv_bfloat16));
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    buffer_ = nullptr;
    throw OutOfMemoryError(MemoryKind::communication, elems * sizeof(__nv_bfloat16), "bf16 wire staging");
  }
  CHECK_CUDA(rc);
  elems_ = elems;
}

void Bf16WireStaging::check_range(size_t elems, size_t offset) const {
  SCALESTUDY_CHECK(offset + elems <= elems_, "bf16 wire staging: " + std::to_string(offset + elems) +
                                                 " elements asked of a buffer of " + std::to_string(elems_));
}

void Bf16WireStaging::to_wire(const float* src, size_t elems, size_t offset) {
  check_range(elems, offset);
  cuda::launch_cast(stream_, at(offset), src, elems);
}

void Bf16WireStaging::from_wire(float* dst, size_t elems, size_t offset) {
  check_range(elems, offset);
  cuda::launch_cast(stream_, dst, at(offset), elems);
}

}  // namespace scalestudy
#endif
