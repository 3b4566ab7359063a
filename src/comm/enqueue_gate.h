#pragma once
// Holds a CUDA stream at a point until the host has finished enqueuing the work behind
// it. The NCCL communicator puts one in front of each collective's `begin` event: without
// it, an idle comm stream would pass `begin` the moment it is recorded and then sit idle
// while the host is still inside ncclAllReduce, and that host time would be counted as
// communication (the kernel profile shows it: the kernels fell short of the intervals).
//
// The wait is a stream memory operation (cuStreamWaitValue32 on a mapped host word,
// reached through cudaGetDriverEntryPointByVersion, so nothing links libcuda); open()
// stores the ticket into that word. Without the driver entry point the gate does nothing.
#if SCALESTUDY_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstdint>

namespace scalestudy {

class EnqueueGate {
 public:
  EnqueueGate();
  ~EnqueueGate();
  EnqueueGate(const EnqueueGate&) = delete;
  EnqueueGate& operator=(const EnqueueGate&) = delete;

  // Enqueues on `stream` a wait for open(ticket); returns the ticket.
  uint32_t close(cudaStream_t stream);
  // Lets every stream waiting for this ticket (or an earlier one) go on.
  void open(uint32_t ticket);
  bool active() const { return wait_value_ != nullptr; }

 private:
  using WaitValue = int (*)(void* stream, unsigned long long address, uint32_t value, unsigned flags);
  WaitValue wait_value_ = nullptr;
  volatile uint32_t* host_word_ = nullptr;
  unsigned long long device_address_ = 0;
  uint32_t last_ticket_ = 0;
};

}  // namespace scalestudy
#endif
