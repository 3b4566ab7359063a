#include "comm/enqueue_gate.h"

#if SCALESTUDY_HAVE_CUDA
#include <cuda.h>

#include <string>

#include "core/check.h"

namespace scalestudy {

EnqueueGate::EnqueueGate() {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // 12000: the version of cuStreamWaitValue32's current signature (its _v2, CUDA 11.7 on).
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &function, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || function == nullptr) return;
  void* word = nullptr;
  CHECK_CUDA(cudaHostAlloc(&word, sizeof(uint32_t), cudaHostAllocMapped));
  host_word_ = static_cast<volatile uint32_t*>(word);
  *host_word_ = 0;
  void* device_word = nullptr;
  CHECK_CUDA(cudaHostGetDevicePointer(&device_word, word, 0));
  device_address_ = reinterpret_cast<unsigned long long>(device_word);
  wait_value_ = reinterpret_cast<WaitValue>(function);
}

EnqueueGate::~EnqueueGate() {
  if (host_word_) cudaFreeHost(const_cast<uint32_t*>(host_word_));
}

uint32_t EnqueueGate::close(cudaStream_t stream) {
  if (!active()) return 0;
  const uint32_t ticket = ++last_ticket_;
  const int status = wait_value_(stream, device_address_, ticket, CU_STREAM_WAIT_VALUE_GEQ);
  if (status != CUDA_SUCCESS)
    abort_job(__FILE__, __LINE__, "cuStreamWaitValue32", "CUresult " + std::to_string(status));
  return ticket;
}

void EnqueueGate::open(uint32_t ticket) {
  if (!active()) return;
  // Tickets only grow, and a waiting stream compares with >=, so a plain store suffices;
  // the fence orders it after the enqueue calls that came before.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  *host_word_ = ticket;
}

}  // namespace scalestudy
#endif
