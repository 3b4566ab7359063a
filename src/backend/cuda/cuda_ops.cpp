#include "backend/cuda/cuda_ops.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "adamw.cuh"
#include "attention.cuh"
#include "backend/cuda/cuda_step_timer.h"
#include "backend/cuda/device_info.h"
#include "core/check.h"
#include "cross_entropy.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "reductions.cuh"

namespace scalestudy {
namespace {

// cudaMalloc returns 256-byte aligned blocks; a zero-byte request still gets a real
// block, because callers take a null pointer for failure.
constexpr size_t kMinAllocationBytes = 256;

// Scratch grows by at least this factor, so a sequence of slightly larger requests
// does not reallocate (and synchronise) every time.
constexpr double kScratchGrowth = 1.5;

}  // namespace

CudaOps::CudaOps(int device) : device_(device) {
  const int count = cuda_device_count();
  SCALESTUDY_CHECK(device >= 0 && device < count,
                   "cuda backend: device " + std::to_string(device) + " requested, " +
                       std::to_string(count) + " visible");
  CHECK_CUDA(cudaSetDevice(device_));
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CHECK_CUBLAS(cublasCreate(&cublas_));
  CHECK_CUBLAS(cublasSetStream(cublas_, stream_));
  // Plain fp32 arithmetic: no TF32 tensor-op shortcuts for fp32 GEMMs.
  CHECK_CUBLAS(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));

  reduction_partials_elems_ = cuda::reduction_scratch_doubles();
  CHECK_CUDA(cudaMalloc(&reduction_partials_, reduction_partials_elems_ * sizeof(double)));
  CHECK_CUDA(cudaMalloc(&device_result_, sizeof(double)));
  CHECK_CUDA(cudaMallocHost(&host_result_, sizeof(double)));
  bytes_by_kind_[static_cast<size_t>(MemoryKind::other)] +=
      (reduction_partials_elems_ + 1) * sizeof(double);
  sample_device_usage();
}

CudaOps::~CudaOps() {
  CHECK_CUDA(cudaSetDevice(device_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  for (auto& entry : allocations_) CHECK_CUDA(cudaFree(entry.first));
  CHECK_CUDA(cudaFree(scratch_));
  CHECK_CUDA(cudaFree(reduction_partials_));
  CHECK_CUDA(cudaFree(device_result_));
  CHECK_CUDA(cudaFreeHost(host_result_));
  CHECK_CUBLAS(cublasDestroy(cublas_));
  CHECK_CUDA(cudaStreamDestroy(stream_));
}

// ---- memory -------------------------------------------------------------------------

void* CudaOps::allocate_bytes(size_t bytes, MemoryKind kind) {
  // The comm thread may allocate too, and the current device is per thread.
  CHECK_CUDA(cudaSetDevice(device_));
  void* ptr = nullptr;
  const cudaError_t rc = cudaMalloc(&ptr, std::max(bytes, kMinAllocationBytes));
  if (rc != cudaSuccess) {
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    abort_job(__FILE__, __LINE__, "cudaMalloc",
              std::string(cudaGetErrorString(rc)) + " allocating " + std::to_string(bytes) +
                  " bytes of " + memory_kind_name(kind) + " on device " +
                  std::to_string(device_) + " (" + std::to_string(free_bytes) + " of " +
                  std::to_string(total_bytes) + " bytes free)");
  }
  sample_device_usage();
  std::lock_guard<std::mutex> lock(memory_mutex_);
  allocations_[ptr] = Allocation{bytes, kind};
  bytes_by_kind_[static_cast<size_t>(kind)] += bytes;
  return ptr;
}

float* CudaOps::allocate_floats(size_t elems, MemoryKind kind) {
  return static_cast<float*>(allocate_bytes(elems * sizeof(float), kind));
}

int32_t* CudaOps::allocate_ints(size_t elems, MemoryKind kind) {
  return static_cast<int32_t*>(allocate_bytes(elems * sizeof(int32_t), kind));
}

void CudaOps::release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto found = allocations_.find(ptr);
    SCALESTUDY_CHECK(found != allocations_.end(),
                     "cuda backend: release of a pointer this backend did not allocate");
    bytes_by_kind_[static_cast<size_t>(found->second.kind)] -= found->second.bytes;
    allocations_.erase(found);
  }
  CHECK_CUDA(cudaSetDevice(device_));
  // Work already queued on the compute stream may still read the buffer.
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  // Whatever others allocated since our last sample may be at its peak now.
  sample_device_usage();
  CHECK_CUDA(cudaFree(ptr));
}

size_t CudaOps::allocated_bytes(MemoryKind kind) const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return bytes_by_kind_[static_cast<size_t>(kind)];
}

void CudaOps::sample_device_usage() const {
  size_t free_bytes = 0, total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  std::lock_guard<std::mutex> lock(memory_mutex_);
  peak_used_bytes_ = std::max(peak_used_bytes_, total_bytes - free_bytes);
}

size_t CudaOps::measured_peak_bytes() const {
  CHECK_CUDA(cudaSetDevice(device_));
  sample_device_usage();
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return peak_used_bytes_;
}

float* CudaOps::scratch_floats(size_t elems) {
  elems = std::max<size_t>(elems, 1);
  if (elems <= scratch_elems_) return scratch_;
  const size_t grown = std::max(elems, static_cast<size_t>(kScratchGrowth * scratch_elems_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  CHECK_CUDA(cudaFree(scratch_));
  scratch_ = nullptr;
  const cudaError_t rc = cudaMalloc(&scratch_, grown * sizeof(float));
  SCALESTUDY_CHECK(rc == cudaSuccess, std::string(cudaGetErrorString(rc)) +
                                          " allocating " + std::to_string(grown * sizeof(float)) +
                                          " bytes of cuda backend scratch");
  sample_device_usage();
  std::lock_guard<std::mutex> lock(memory_mutex_);
  bytes_by_kind_[static_cast<size_t>(MemoryKind::other)] +=
      (grown - scratch_elems_) * sizeof(float);
  scratch_elems_ = grown;
  return scratch_;
}

void CudaOps::fill_zero(float* dst, size_t elems) {
  cuda::launch_fill(stream_, dst, elems, 0.0f);
}

// Overlapping ranges go through scratch: cudaMemcpy, unlike memmove, leaves overlap
// undefined, and the CPU backend allows a copy onto an overlapping view of itself.
void CudaOps::copy(float* dst, const float* src, size_t elems) {
  if (elems == 0 || dst == src) return;
  const size_t bytes = elems * sizeof(float);
  const auto dst_begin = reinterpret_cast<uintptr_t>(dst);
  const auto src_begin = reinterpret_cast<uintptr_t>(src);
  const bool overlap = dst_begin < src_begin + bytes && src_begin < dst_begin + bytes;
  if (!overlap) {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  float* staging = scratch_floats(elems);
  CHECK_CUDA(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  CHECK_CUDA(cudaMemcpyAsync(dst, staging, bytes, cudaMemcpyDeviceToDevice, stream_));
}

// Queued on the compute stream (a legacy-stream cudaMemcpy would not be ordered with
// it), then waited for: the host buffer holds the data on return.
void CudaOps::copy_to_host(float* host_dst, const float* src, size_t elems) {
  if (elems == 0) return;
  CHECK_CUDA(cudaMemcpyAsync(host_dst, src, elems * sizeof(float), cudaMemcpyDeviceToHost,
                             stream_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
}

// Waited for as well: from pageable memory cudaMemcpyAsync returns once the data is
// staged, but from pinned memory it returns at once, and the caller may reuse the host
// buffer (the next micro-batch's tokens) as soon as this returns.
void CudaOps::copy_host_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  CHECK_CUDA(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
}

void CudaOps::copy_from_host(float* dst, const float* host_src, size_t elems) {
  copy_host_to_device(dst, host_src, elems * sizeof(float));
}

void CudaOps::copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) {
  copy_host_to_device(dst, host_src, elems * sizeof(int32_t));
}

void CudaOps::synchronize() { CHECK_CUDA(cudaStreamSynchronize(stream_)); }

std::unique_ptr<StepTimer> CudaOps::make_step_timer() {
  return std::make_unique<CudaStepTimer>(stream_);
}

// ---- ops ----------------------------------------------------------------------------

void CudaOps::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int batch, int seq, int channels) {
  cuda::launch_embedding_forward(stream_, out, tokens, wte, wpe, batch, seq, channels);
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                 const int32_t* tokens, int batch, int seq, int channels) {
  cuda::launch_embedding_backward(stream_, dwte, dwpe, dout, tokens, batch, seq, channels);
}

void CudaOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int rows,
                                int channels) {
  cuda::launch_layernorm_forward(stream_, out, mean, rstd, inp, weight, bias, rows, channels);
}

void CudaOps::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int rows, int channels) {
  const size_t scratch_elems = cuda::layernorm_backward_scratch_elems(rows, channels);
  float* scratch = scratch_floats(scratch_elems);
  cuda::launch_layernorm_backward(stream_, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                  rows, channels, scratch, scratch_elems_);
}

void CudaOps::matmul_forward(float* out, const float* inp, const float* weight,
                             const float* bias, int rows, int in_channels, int out_channels) {
  cuda::launch_matmul_forward(cublas_, stream_, out, inp, weight, bias, rows, in_channels,
                              out_channels);
}

void CudaOps::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int rows, int in_channels,
                              int out_channels) {
  float* scratch = nullptr;
  if (dbias != nullptr)
    scratch = scratch_floats(cuda::matmul_backward_scratch_elems(rows, out_channels));
  cuda::launch_matmul_backward(cublas_, stream_, dinp, dweight, dbias, dout, inp, weight, rows,
                               in_channels, out_channels, scratch,
                               scratch != nullptr ? scratch_elems_ : 0);
}

void CudaOps::attention_forward(float* out, float* probs, const float* qkv,
                                const AttentionShape& shape) {
  cuda::launch_attention_forward(cublas_, stream_, out, probs, qkv, shape);
}

void CudaOps::attention_backward(float* dqkv, const float* dout, const float* qkv,
                                 const float* probs, const AttentionShape& shape) {
  float* scratch = scratch_floats(cuda::attention_backward_scratch_elems(shape));
  cuda::launch_attention_backward(cublas_, stream_, dqkv, dout, qkv, probs, shape, scratch,
                                  scratch_elems_);
}

void CudaOps::gelu_forward(float* out, const float* inp, size_t elems) {
  cuda::launch_gelu_forward(stream_, out, inp, elems);
}

void CudaOps::gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems) {
  cuda::launch_gelu_backward(stream_, dinp, inp, dout, elems);
}

void CudaOps::residual_forward(float* out, const float* a, const float* b, size_t elems) {
  cuda::launch_residual_forward(stream_, out, a, b, elems);
}

void CudaOps::accumulate(float* dst, const float* src, size_t elems) {
  cuda::launch_accumulate(stream_, dst, src, elems);
}

void CudaOps::softmax_cross_entropy_forward(float* losses, float* probs, const float* logits,
                                            const int32_t* targets, int rows, int vocab) {
  cuda::launch_softmax_cross_entropy_forward(stream_, losses, probs, logits, targets, rows,
                                             vocab);
}

void CudaOps::softmax_cross_entropy_backward(float* dlogits, const float* probs,
                                             const int32_t* targets, int rows, int vocab,
                                             float loss_scale) {
  cuda::launch_softmax_cross_entropy_backward(stream_, dlogits, probs, targets, rows, vocab,
                                              loss_scale);
}

double CudaOps::read_device_double() {
  CHECK_CUDA(cudaMemcpyAsync(host_result_, device_result_, sizeof(double),
                             cudaMemcpyDeviceToHost, stream_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  return *host_result_;
}

double CudaOps::sum(const float* x, size_t elems) {
  cuda::launch_sum(stream_, device_result_, x, elems, reduction_partials_,
                   reduction_partials_elems_);
  return read_device_double();
}

double CudaOps::sum_of_squares(const float* x, size_t elems) {
  cuda::launch_sum_of_squares(stream_, device_result_, x, elems, reduction_partials_,
                              reduction_partials_elems_);
  return read_device_double();
}

void CudaOps::scale(float* x, size_t elems, float factor) {
  cuda::launch_scale(stream_, x, elems, factor);
}

void CudaOps::adamw_update(float* params, const float* grads, float* m, float* v, size_t elems,
                           const AdamWParams& hyper) {
  cuda::launch_adamw_update(stream_, params, grads, m, v, elems, hyper);
}

}  // namespace scalestudy
