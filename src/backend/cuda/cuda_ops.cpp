#include "backend/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "adamw.cuh"
#include "attention.cuh"
#include "flash_attention.cuh"
#include "backend/cuda/cuda_step_timer.h"
#include "backend/cuda/cupti_tracer.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/half_host.h"
#include "core/check.h"
#include "profile/kernel_tag.h"
#include "cross_entropy.cuh"
#include "dense_gelu.cuh"
#include "gemm_lt.cuh"
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

// Both 16-bit storage types take 2 bytes an element.
constexpr size_t kHalfBytes = 2;
static_assert(sizeof(__nv_bfloat16) == kHalfBytes && sizeof(__half) == kHalfBytes);

// The 16-bit storage type of a precision, as a value to dispatch on.
template <class T>
struct Storage {
  using type = T;
};

// Calls f(Storage<T>{}) with T the 16-bit type of `precision`: __half for fp16,
// __nv_bfloat16 for bf16 (the only other precision that has 16-bit storage).
template <class F>
void with_half_type(Precision precision, F&& f) {
  if (precision == Precision::fp16)
    f(Storage<__half>{});
  else
    f(Storage<__nv_bfloat16>{});
}

// Typed views of float* handles whose storage the registry reported as 16-bit.
template <class T>
T* as(float* ptr) {
  return reinterpret_cast<T*>(ptr);
}
template <class T>
const T* as(const float* ptr) {
  return reinterpret_cast<const T*>(ptr);
}
template <class T>
const T* as(const void* ptr) {
  return static_cast<const T*>(ptr);
}

}  // namespace

CudaOps::CudaOps(int device, Precision precision) : device_(device), precision_(precision) {
  const int count = cuda_device_count();
  SCALESTUDY_CHECK(device >= 0 && device < count,
                   "cuda backend: device " + std::to_string(device) + " requested, " +
                       std::to_string(count) + " visible");
  CHECK_CUDA(cudaSetDevice(device_));
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CHECK_CUBLAS(cublasCreate(&cublas_));
  CHECK_CUBLAS(cublasSetStream(cublas_, stream_));
  // Plain fp32 arithmetic: no TF32 tensor-op shortcuts for fp32 GEMMs. (bf16 and fp16 GEMMs
  // use the tensor cores whatever the math mode.) fp16 also keeps split-K reductions in
  // fp32 (see cuda_ops.h).
  const int math_mode =
      precision_ == Precision::fp16
          ? CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
          : CUBLAS_DEFAULT_MATH;
  CHECK_CUBLAS(cublasSetMathMode(cublas_, static_cast<cublasMath_t>(math_mode)));
  if (half_mode()) {
    epilogue_gemm_ = std::make_unique<cuda::EpilogueGemm>();
    bytes_by_kind_[static_cast<size_t>(MemoryKind::other)] += cuda::EpilogueGemm::kWorkspaceBytes;
  }

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
  for (auto& entry : allocations_) {
    CHECK_CUDA(cudaFree(reinterpret_cast<void*>(entry.first)));
    CHECK_CUDA(cudaFree(entry.second.parameter_copy));
  }
  for (AdamWTable& table : adamw_tables_) CHECK_CUDA(cudaFree(table.device));
  CHECK_CUDA(cudaFree(scratch_));
  CHECK_CUDA(cudaFree(reduction_partials_));
  CHECK_CUDA(cudaFree(device_result_));
  CHECK_CUDA(cudaFreeHost(host_result_));
  epilogue_gemm_.reset();
  CHECK_CUBLAS(cublasDestroy(cublas_));
  CHECK_CUDA(cudaStreamDestroy(stream_));
}

// ---- memory -------------------------------------------------------------------------

void* CudaOps::device_malloc(size_t bytes, MemoryKind kind) {
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
  return ptr;
}

void* CudaOps::allocate_bytes(size_t bytes, MemoryKind kind, bool half) {
  void* ptr = device_malloc(bytes, kind);
  sample_device_usage();
  std::lock_guard<std::mutex> lock(memory_mutex_);
  allocations_[reinterpret_cast<uintptr_t>(ptr)] = Allocation{bytes, kind, half, nullptr, 0};
  bytes_by_kind_[static_cast<size_t>(kind)] += bytes;
  return ptr;
}

float* CudaOps::allocate_floats(size_t elems, MemoryKind kind) {
  if (!half_mode()) return static_cast<float*>(allocate_bytes(elems * sizeof(float), kind));
  if (kind == MemoryKind::activations)
    return static_cast<float*>(allocate_bytes(elems * kHalfBytes, kind, true));
  float* ptr = static_cast<float*>(allocate_bytes(elems * sizeof(float), kind));
  if (kind == MemoryKind::parameters) {
    // All-ones bytes are a NaN in bf16 and in fp16 alike: GEMMs on a copy that
    // parameters_changed never filled give NaN.
    const size_t copy_bytes = elems * kHalfBytes;
    void* copy = device_malloc(copy_bytes, kind);
    CHECK_CUDA(cudaMemsetAsync(copy, 0xff, copy_bytes, stream_));
    sample_device_usage();
    std::lock_guard<std::mutex> lock(memory_mutex_);
    Allocation& record = allocations_.at(reinterpret_cast<uintptr_t>(ptr));
    record.parameter_copy = copy;
    record.parameter_copy_bytes = copy_bytes;
    bytes_by_kind_[static_cast<size_t>(kind)] += copy_bytes;
  }
  return ptr;
}

float* CudaOps::allocate_statistics(size_t elems) {
  return static_cast<float*>(allocate_bytes(elems * sizeof(float), MemoryKind::activations));
}

int32_t* CudaOps::allocate_ints(size_t elems, MemoryKind kind) {
  return static_cast<int32_t*>(allocate_bytes(elems * sizeof(int32_t), kind));
}

void CudaOps::release(void* ptr) {
  if (ptr == nullptr) return;
  void* parameter_copy = nullptr;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto found = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
    SCALESTUDY_CHECK(found != allocations_.end(),
                     "cuda backend: release of a pointer this backend did not allocate");
    const Allocation& record = found->second;
    bytes_by_kind_[static_cast<size_t>(record.kind)] -=
        record.bytes + record.parameter_copy_bytes;
    parameter_copy = record.parameter_copy;
    allocations_.erase(found);
  }
  CHECK_CUDA(cudaSetDevice(device_));
  // Work already queued on the compute stream may still read the buffer.
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  // Whatever others allocated since our last sample may be at its peak now.
  sample_device_usage();
  CHECK_CUDA(cudaFree(ptr));
  CHECK_CUDA(cudaFree(parameter_copy));
}

size_t CudaOps::allocated_bytes(MemoryKind kind) const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return bytes_by_kind_[static_cast<size_t>(kind)];
}

CudaOps::Lookup CudaOps::find_allocation(const void* ptr) const {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto after = allocations_.upper_bound(address);
  if (after == allocations_.begin()) return Lookup{};
  const auto& [base, record] = *std::prev(after);
  // A zero-byte allocation still owns its base address.
  if (address - base >= std::max<size_t>(record.bytes, 1)) return Lookup{};
  return Lookup{true, base, record};
}

bool CudaOps::stores_half(const void* ptr, const char* what) const {
  if (!half_mode() || ptr == nullptr) return false;
  const Lookup lookup = find_allocation(ptr);
  if (!lookup.found || !lookup.allocation.half) return false;
  SCALESTUDY_CHECK(reinterpret_cast<uintptr_t>(ptr) == lookup.base,
                   std::string("cuda backend (") + mode_name() + "): " + what + " points into a " +
                       mode_name() +
                       " activation buffer; activation handles are opaque and must be passed "
                       "as allocated");
  return true;
}

bool CudaOps::half_operands(const char* op, std::initializer_list<Operand> operands) const {
  if (!half_mode()) return false;
  int half = 0, fp32 = 0;
  for (const Operand& operand : operands) {
    if (operand.ptr == nullptr) continue;
    (stores_half(operand.ptr, operand.what) ? half : fp32) += 1;
  }
  SCALESTUDY_CHECK(half == 0 || fp32 == 0,
                   std::string("cuda backend (") + mode_name() + "): " + op + " mixes " +
                       mode_name() +
                       " activations with fp32 buffers; its activation operands must all come "
                       "from allocate_floats(..., MemoryKind::activations)");
  return half > 0;
}

void CudaOps::require_fp32(const void* ptr, const char* what) const {
  SCALESTUDY_CHECK(!stores_half(ptr, what),
                   std::string("cuda backend (") + mode_name() + "): " + what +
                       " must be fp32 (statistics from allocate_statistics, or gradients, "
                       "parameters, optimizer state), not a " + mode_name() +
                       " activation buffer");
}

const void* CudaOps::parameter_copy_or_null(const float* param) const {
  const Lookup lookup = find_allocation(param);
  if (!lookup.found || lookup.allocation.parameter_copy == nullptr) return nullptr;
  return parameter_copy_of(param);
}

const void* CudaOps::parameter_copy_of(const float* weight) const {
  const Lookup lookup = find_allocation(weight);
  SCALESTUDY_CHECK(lookup.found && lookup.allocation.parameter_copy != nullptr,
                   std::string("cuda backend (") + mode_name() +
                       "): a GEMM weight must lie in the MemoryKind::parameters allocation, "
                       "whose 16-bit copy the GEMM reads");
  const size_t offset_bytes = reinterpret_cast<uintptr_t>(weight) - lookup.base;
  SCALESTUDY_CHECK(offset_bytes % sizeof(float) == 0, "cuda backend: misaligned weight pointer");
  return static_cast<const char*>(lookup.allocation.parameter_copy) +
         offset_bytes / sizeof(float) * kHalfBytes;
}

void CudaOps::parameters_changed(const float* params, size_t begin_elems, size_t end_elems) {
  ScopedKernelTag tag(KernelCategory::optimizer);
  if (!half_mode() || begin_elems == end_elems) return;
  SCALESTUDY_CHECK(begin_elems < end_elems, "parameters_changed: begin after end");
  const Lookup lookup = find_allocation(params);
  SCALESTUDY_CHECK(lookup.found && lookup.allocation.parameter_copy != nullptr,
                   "parameters_changed: the pointer is not in a MemoryKind::parameters "
                   "allocation");
  const size_t offset_bytes = reinterpret_cast<uintptr_t>(params) - lookup.base;
  SCALESTUDY_CHECK(offset_bytes % sizeof(float) == 0 &&
                       offset_bytes + end_elems * sizeof(float) <= lookup.allocation.bytes,
                   "parameters_changed: range outside the parameters allocation");
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    Half* copy =
        static_cast<Half*>(lookup.allocation.parameter_copy) + offset_bytes / sizeof(float);
    cuda::launch_cast(stream_, copy + begin_elems, params + begin_elems, end_elems - begin_elems);
  });
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
  ScopedKernelTag tag(KernelCategory::memory);
  // All-zero bytes are +0 in bf16 and fp16 alike.
  if (stores_half(dst, "fill_zero dst")) {
    if (elems > 0) CHECK_CUDA(cudaMemsetAsync(dst, 0, elems * kHalfBytes, stream_));
    return;
  }
  cuda::launch_fill(stream_, dst, elems, 0.0f);
}

// Overlapping ranges go through scratch: cudaMemcpy, unlike memmove, leaves overlap
// undefined, and the CPU backend allows a copy onto an overlapping view of itself.
// 16-bit handles are whole buffers, so two of them overlap only when they are equal, and
// a 16-bit buffer never overlaps an fp32 one.
void CudaOps::copy(float* dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  if (elems == 0 || dst == src) return;
  const bool dst_half = stores_half(dst, "copy dst"), src_half = stores_half(src, "copy src");
  if (dst_half && src_half) {
    CHECK_CUDA(
        cudaMemcpyAsync(dst, src, elems * kHalfBytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  if (dst_half || src_half) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      if (dst_half)
        cuda::launch_cast(stream_, as<Half>(dst), src, elems);
      else
        cuda::launch_cast(stream_, dst, as<Half>(src), elems);
    });
    return;
  }
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
// it), then waited for: the host buffer holds the data on return. 16-bit storage is
// widened (exactly) on the host.
void CudaOps::copy_to_host(float* host_dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  if (elems == 0) return;
  if (stores_half(src, "copy_to_host src")) {
    std::vector<uint16_t> bits(elems);
    CHECK_CUDA(cudaMemcpyAsync(bits.data(), src, elems * sizeof(uint16_t),
                               cudaMemcpyDeviceToHost, stream_));
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < elems; ++i) host_dst[i] = float_from_half_bits(precision_, bits[i]);
    return;
  }
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

// 16-bit storage gets the values rounded to nearest even on the host, as the device's
// casts round them (fp16: +-inf from 65520 up).
void CudaOps::copy_from_host(float* dst, const float* host_src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  if (stores_half(dst, "copy_from_host dst")) {
    std::vector<uint16_t> bits(elems);
    for (size_t i = 0; i < elems; ++i) bits[i] = half_bits_from_float(precision_, host_src[i]);
    copy_host_to_device(dst, bits.data(), elems * sizeof(uint16_t));
    return;
  }
  copy_host_to_device(dst, host_src, elems * sizeof(float));
}

void CudaOps::copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::memory);
  copy_host_to_device(dst, host_src, elems * sizeof(int32_t));
}

void CudaOps::synchronize() { CHECK_CUDA(cudaStreamSynchronize(stream_)); }

std::unique_ptr<StepTimer> CudaOps::make_step_timer() {
  return std::make_unique<CudaStepTimer>(stream_);
}

std::unique_ptr<KernelTracer> CudaOps::make_kernel_tracer() {
  std::unique_ptr<KernelTracer> tracer = make_cupti_tracer(cuda_device_description(device_));
  tracer->name_stream("compute", stream_);
  return tracer;
}

// ---- ops ----------------------------------------------------------------------------
// Each op asks the registry whether its activation operands are 16-bit (always false in
// fp32 mode, where nothing is looked up) and runs the matching kernels: with_half_type
// picks the instantiation for the precision's 16-bit type, bf16 or fp16.

void CudaOps::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                const float* wpe, int batch, int seq, int channels) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  if (stores_half(out, "embedding out")) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_embedding_forward(stream_, as<Half>(out), tokens, wte, wpe, batch, seq,
                                     channels);
    });
    return;
  }
  cuda::launch_embedding_forward(stream_, out, tokens, wte, wpe, batch, seq, channels);
}

void CudaOps::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                 const int32_t* tokens, int batch, int seq, int channels) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(dwte, "embedding dwte");
  require_fp32(dwpe, "embedding dwpe");
  if (stores_half(dout, "embedding dout")) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_embedding_backward(stream_, dwte, dwpe, as<Half>(dout), tokens, batch, seq,
                                      channels);
    });
    return;
  }
  cuda::launch_embedding_backward(stream_, dwte, dwpe, dout, tokens, batch, seq, channels);
}

void CudaOps::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int rows,
                                int channels) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(mean, "layernorm mean");
  require_fp32(rstd, "layernorm rstd");
  if (half_operands("layernorm_forward", {{out, "out"}, {inp, "inp"}})) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_layernorm_forward(stream_, as<Half>(out), mean, rstd, as<Half>(inp), weight,
                                     bias, rows, channels);
    });
    return;
  }
  cuda::launch_layernorm_forward(stream_, out, mean, rstd, inp, weight, bias, rows, channels);
}

void CudaOps::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int rows, int channels,
                                 GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  require_fp32(mean, "layernorm mean");
  require_fp32(rstd, "layernorm rstd");
  const bool half =
      half_operands("layernorm_backward", {{dinp, "dinp"}, {dout, "dout"}, {inp, "inp"}});
  const size_t scratch_elems = cuda::layernorm_backward_scratch_elems(rows, channels);
  float* scratch = scratch_floats(scratch_elems);
  if (half) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_layernorm_backward(stream_, as<Half>(dinp), dweight, dbias, as<Half>(dout),
                                      as<Half>(inp), weight, mean, rstd, rows, channels, scratch,
                                      scratch_elems_, accumulate_dinp);
    });
    return;
  }
  cuda::launch_layernorm_backward(stream_, dinp, dweight, dbias, dout, inp, weight, mean, rstd,
                                  rows, channels, scratch, scratch_elems_, accumulate_dinp);
}

void CudaOps::matmul_forward(float* out, const float* inp, const float* weight,
                             const float* bias, int rows, int in_channels, int out_channels) {
  ScopedKernelTag tag(KernelCategory::gemm);
  if (half_operands("matmul_forward", {{out, "out"}, {inp, "inp"}})) {
    const size_t scratch_elems = cuda::matmul_forward_scratch_elems_16bit(rows, out_channels);
    float* scratch = scratch_elems > 0 ? scratch_floats(scratch_elems) : nullptr;
    const void* weight_copy = parameter_copy_of(weight);
    // A bias outside the parameters (none in the model) has no 16-bit copy: it takes the
    // bias kernel.
    const void* bias_copy = bias != nullptr ? parameter_copy_or_null(bias) : nullptr;
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_matmul_forward(cublas_, stream_, as<Half>(out), as<Half>(inp),
                                  as<Half>(weight_copy), bias, rows, in_channels, out_channels,
                                  scratch, scratch != nullptr ? scratch_elems_ : 0,
                                  epilogue_gemm_.get(), as<Half>(bias_copy));
    });
    return;
  }
  cuda::launch_matmul_forward(cublas_, stream_, out, inp, weight, bias, rows, in_channels,
                              out_channels);
}

void CudaOps::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, int rows, int in_channels,
                              int out_channels, GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::gemm);
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  require_fp32(dweight, "matmul dweight");
  require_fp32(dbias, "matmul dbias");
  const bool half =
      half_operands("matmul_backward", {{dinp, "dinp"}, {dout, "dout"}, {inp, "inp"}});
  if (half) {
    // Scratch for the bias reduction and, where out_channels needs them, padded rows.
    float* scratch =
        scratch_floats(cuda::matmul_backward_scratch_elems_16bit(rows, out_channels));
    const void* weight_copy = parameter_copy_of(weight);
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_matmul_backward(cublas_, stream_, as<Half>(dinp), dweight, dbias,
                                   as<Half>(dout), as<Half>(inp), as<Half>(weight_copy), rows,
                                   in_channels, out_channels, scratch, scratch_elems_,
                                   accumulate_dinp);
    });
    return;
  }
  float* scratch = nullptr;
  if (dbias != nullptr)
    scratch = scratch_floats(cuda::matmul_backward_scratch_elems(rows, out_channels));
  const size_t scratch_elems = scratch != nullptr ? scratch_elems_ : 0;
  cuda::launch_matmul_backward(cublas_, stream_, dinp, dweight, dbias, dout, inp, weight, rows,
                               in_channels, out_channels, scratch, scratch_elems,
                               accumulate_dinp);
}

// The epilogue reads the bias from the parameters' 16-bit copy: a bias outside the
// parameters (or none) takes the plain ops, as does any shape cuBLASLt declines.
// bf16 only. In fp16 cuBLASLt's GELU epilogue missed the tanh GELU by more than the fp16
// rounding: on an H200 (CUDA 13, commit d8fc352), 14801 of 786432 outputs were off by up
// to ~8 fp16 ulps in the tails (-6.046e-4 against -6.083e-4), and 13075 derivatives
// likewise (docs/measurements/2026-11-22-h200-gelu-epilogue/). In bf16 the same
// differences stay within one bf16 rounding, which the GPU test
// GeluEpiloguesTakeTheGpt2ShapesAndAreTheTanhGelu checks.
bool CudaOps::gelu_epilogues_allowed() const { return precision_ == Precision::bf16; }

void CudaOps::dense_gelu_forward(float* pre, float* out, const float* inp, const float* weight,
                                 const float* bias, int rows, int in_channels,
                                 int out_channels) {
  if (half_operands("dense_gelu_forward", {{pre, "pre"}, {out, "out"}, {inp, "inp"}}) &&
      bias != nullptr && gelu_epilogues_allowed()) {
    const void* bias_copy = parameter_copy_or_null(bias);
    bool fused = false;
    if (bias_copy != nullptr) {
      const void* weight_copy = parameter_copy_of(weight);
      ScopedKernelTag tag(KernelCategory::gemm);
      with_half_type(precision_, [&](auto storage) {
        using Half = typename decltype(storage)::type;
        fused = cuda::launch_dense_gelu_forward(*epilogue_gemm_, stream_, as<Half>(pre),
                                                as<Half>(out), as<Half>(inp),
                                                as<Half>(weight_copy), as<Half>(bias_copy), rows,
                                                in_channels, out_channels);
      });
    }
    if (fused) {
      ++gelu_epilogue_gemms_;
      return;
    }
  }
  Ops::dense_gelu_forward(pre, out, inp, weight, bias, rows, in_channels, out_channels);
}

// Where cuBLASLt declines the GELU's derivative in the epilogue nothing has been written,
// and the plain ops run instead, through dact_scratch.
void CudaOps::dense_backward_through_gelu(float* dpre, float* dweight, float* dbias,
                                          const float* dout, const float* act, const float* pre,
                                          const float* weight, int rows, int in_channels,
                                          int out_channels, float* dact_scratch) {
  if (half_operands("dense_backward_through_gelu", {{dpre, "dpre"}, {dout, "dout"}, {act, "act"},
                                                    {pre, "pre"}, {dact_scratch, "dact_scratch"}}) &&
      gelu_epilogues_allowed()) {
    require_fp32(dweight, "dense_backward_through_gelu dweight");
    require_fp32(dbias, "dense_backward_through_gelu dbias");
    float* scratch = nullptr;
    if (dbias != nullptr)
      scratch =
          scratch_floats(cuda::dense_backward_through_gelu_scratch_elems(rows, out_channels));
    const size_t scratch_elems = scratch != nullptr ? scratch_elems_ : 0;
    const void* weight_copy = parameter_copy_of(weight);
    bool fused = false;
    {
      ScopedKernelTag tag(KernelCategory::gemm);
      with_half_type(precision_, [&](auto storage) {
        using Half = typename decltype(storage)::type;
        fused = cuda::launch_dense_backward_through_gelu(
            *epilogue_gemm_, cublas_, stream_, as<Half>(dpre), dweight, dbias, as<Half>(dout),
            as<Half>(act), as<Half>(pre), as<Half>(weight_copy), rows, in_channels, out_channels,
            scratch, scratch_elems);
      });
    }
    if (fused) {
      ++gelu_epilogue_gemms_;
      return;
    }
  }
  Ops::dense_backward_through_gelu(dpre, dweight, dbias, dout, act, pre, weight, rows,
                                   in_channels, out_channels, dact_scratch);
}

float* CudaOps::allocate_attention_state(const AttentionShape& shape) {
  if (half_mode() && cuda::flash_attention_supported(shape))
    return allocate_statistics(static_cast<size_t>(shape.batch) * shape.heads * shape.seq);
  return Ops::allocate_attention_state(shape);
}

// In bf16/fp16 an fp32 state is the fused kernels' log-sum-exp (allocate_attention_state).
bool CudaOps::fused_attention_state(const float* state, const AttentionShape& shape) const {
  if (!half_mode() || stores_half(state, "state")) return false;
  SCALESTUDY_CHECK(cuda::flash_attention_supported(shape),
                   "an fp32 attention state in " + std::string(mode_name()) +
                       " asks for the fused kernels, which do not take this shape");
  return true;
}

void CudaOps::attention_forward(float* out, float* state, const float* qkv,
                                const AttentionShape& shape) {
  ScopedKernelTag tag(KernelCategory::attention);
  if (fused_attention_state(state, shape)) {
    SCALESTUDY_CHECK(half_operands("attention_forward", {{out, "out"}, {qkv, "qkv"}}),
                     "the fused attention needs 16-bit out and qkv");
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_flash_attention_forward(stream_, as<Half>(out), state, as<Half>(qkv), shape);
    });
    return;
  }
  if (half_operands("attention_forward", {{out, "out"}, {state, "probs"}, {qkv, "qkv"}})) {
    float* scratch = scratch_floats(cuda::attention_forward_scratch_elems_16bit(shape));
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_attention_forward(cublas_, stream_, as<Half>(out), as<Half>(state),
                                     as<Half>(qkv), shape, scratch, scratch_elems_);
    });
    return;
  }
  cuda::launch_attention_forward(cublas_, stream_, out, state, qkv, shape);
}

void CudaOps::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                 const float* state, const AttentionShape& shape,
                                 GradientWrite dqkv_write) {
  ScopedKernelTag tag(KernelCategory::attention);
  const bool accumulate_dqkv = dqkv_write == GradientWrite::accumulate;
  if (fused_attention_state(state, shape)) {
    SCALESTUDY_CHECK(half_operands("attention_backward", {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {out, "out"}}),
                     "the fused attention needs 16-bit dqkv, dout, qkv and out");
    float* scratch = scratch_floats(cuda::flash_attention_backward_scratch_elems(shape));
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_flash_attention_backward(stream_, as<Half>(dqkv), as<Half>(dout), as<Half>(qkv), as<Half>(out),
                                            state, shape, scratch, scratch_elems_,
                                            accumulate_dqkv);
    });
    return;
  }
  if (!accumulate_dqkv)
    fill_zero(dqkv, size_t(shape.batch) * shape.seq * 3 * size_t(shape.channels));
  if (half_operands("attention_backward",
                    {{dqkv, "dqkv"}, {dout, "dout"}, {qkv, "qkv"}, {state, "probs"}})) {
    float* scratch = scratch_floats(cuda::attention_backward_scratch_elems_16bit(shape));
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_attention_backward(cublas_, stream_, as<Half>(dqkv), as<Half>(dout),
                                      as<Half>(qkv), as<Half>(state), shape, scratch,
                                      scratch_elems_);
    });
    return;
  }
  float* scratch = scratch_floats(cuda::attention_backward_scratch_elems(shape));
  cuda::launch_attention_backward(cublas_, stream_, dqkv, dout, qkv, state, shape, scratch,
                                  scratch_elems_);
}

void CudaOps::gelu_forward(float* out, const float* inp, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  if (half_operands("gelu_forward", {{out, "out"}, {inp, "inp"}})) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_gelu_forward(stream_, as<Half>(out), as<Half>(inp), elems);
    });
    return;
  }
  cuda::launch_gelu_forward(stream_, out, inp, elems);
}

void CudaOps::gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems,
                            GradientWrite dinp_write) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  const bool accumulate_dinp = dinp_write == GradientWrite::accumulate;
  if (half_operands("gelu_backward", {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}})) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_gelu_backward(stream_, as<Half>(dinp), as<Half>(inp), as<Half>(dout), elems,
                                 accumulate_dinp);
    });
    return;
  }
  cuda::launch_gelu_backward(stream_, dinp, inp, dout, elems, accumulate_dinp);
}

void CudaOps::residual_forward(float* out, const float* a, const float* b, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  if (half_operands("residual_forward", {{out, "out"}, {a, "a"}, {b, "b"}})) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_residual_forward(stream_, as<Half>(out), as<Half>(a), as<Half>(b), elems);
    });
    return;
  }
  cuda::launch_residual_forward(stream_, out, a, b, elems);
}

void CudaOps::accumulate(float* dst, const float* src, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  if (half_operands("accumulate", {{dst, "dst"}, {src, "src"}})) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_accumulate(stream_, as<Half>(dst), as<Half>(src), elems);
    });
    return;
  }
  cuda::launch_accumulate(stream_, dst, src, elems);
}

int CudaOps::padded_logits_stride(const float* logits, int rows, int vocab) const {
  if (!half_mode() || logits == nullptr) return 0;
  const Lookup lookup = find_allocation(logits);
  if (!lookup.found || lookup.allocation.logits_row_elems == 0) return 0;
  const int stride = lookup.allocation.logits_row_elems;
  SCALESTUDY_CHECK(reinterpret_cast<uintptr_t>(logits) == lookup.base &&
                       stride == cuda::padded_logits_row_elems(vocab) &&
                       lookup.allocation.bytes >= size_t(rows) * stride * kHalfBytes,
                   "cuda backend: a logits buffer from allocate_logits is used with other rows "
                   "or another vocabulary than it was allocated for");
  return stride;
}

void CudaOps::softmax_cross_entropy_forward(float* losses, float* row_stats, const float* logits,
                                            const int32_t* targets, int rows, int vocab) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(losses, "cross-entropy losses");
  require_fp32(row_stats, "cross-entropy row statistics");
  SCALESTUDY_CHECK(padded_logits_stride(logits, rows, vocab) == 0,
                   "cross-entropy: padded logits from allocate_logits go to classifier_forward");
  if (stores_half(logits, "cross-entropy logits")) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_softmax_cross_entropy_forward(stream_, losses, row_stats, as<Half>(logits),
                                                 targets, rows, vocab, vocab);
    });
    return;
  }
  cuda::launch_softmax_cross_entropy_forward(stream_, losses, row_stats, logits, targets, rows,
                                             vocab, vocab);
}

void CudaOps::softmax_cross_entropy_backward(float* dlogits, const float* logits,
                                             const float* row_stats, const int32_t* targets,
                                             int rows, int vocab, float loss_scale) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  require_fp32(row_stats, "cross-entropy row statistics");
  SCALESTUDY_CHECK(padded_logits_stride(logits, rows, vocab) == 0 &&
                       padded_logits_stride(dlogits, rows, vocab) == 0,
                   "cross-entropy: padded logits from allocate_logits go to classifier_backward");
  if (half_operands("softmax_cross_entropy_backward", {{dlogits, "dlogits"}, {logits, "logits"}})) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_softmax_cross_entropy_backward(stream_, as<Half>(dlogits), as<Half>(logits),
                                                  row_stats, targets, rows, vocab, vocab,
                                                  loss_scale);
    });
    return;
  }
  cuda::launch_softmax_cross_entropy_backward(stream_, dlogits, logits, row_stats, targets, rows,
                                              vocab, vocab, loss_scale);
}

float* CudaOps::allocate_logits(int rows, int vocab) {
  if (!half_mode()) return Ops::allocate_logits(rows, vocab);
  SCALESTUDY_CHECK(rows > 0 && vocab > 0, "allocate_logits: rows and vocab must be positive");
  const int stride = cuda::padded_logits_row_elems(vocab);
  float* logits = allocate_floats(size_t(rows) * stride, MemoryKind::activations);
  // The padding columns are never read; zeroed, they hold no NaN for a debugger to find.
  CHECK_CUDA(cudaMemsetAsync(logits, 0, size_t(rows) * stride * kHalfBytes, stream_));
  std::lock_guard<std::mutex> lock(memory_mutex_);
  allocations_.at(reinterpret_cast<uintptr_t>(logits)).logits_row_elems = stride;
  return logits;
}

void CudaOps::classifier_forward(float* losses, float* row_stats, float* logits,
                                 const float* inp, const float* weight, const int32_t* targets,
                                 int rows, int channels, int vocab) {
  const int stride = padded_logits_stride(logits, rows, vocab);
  if (stride == 0) {
    Ops::classifier_forward(losses, row_stats, logits, inp, weight, targets, rows, channels,
                            vocab);
    return;
  }
  require_fp32(losses, "cross-entropy losses");
  require_fp32(row_stats, "cross-entropy row statistics");
  SCALESTUDY_CHECK(stores_half(inp, "classifier inp"),
                   "classifier_forward: inp must be an activation buffer like the logits");
  const void* weight_copy = parameter_copy_of(weight);
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    {
      ScopedKernelTag tag(KernelCategory::gemm);
      cuda::launch_classifier_matmul_forward(cublas_, stream_, as<Half>(logits), stride,
                                             as<Half>(inp), as<Half>(weight_copy), rows, channels,
                                             vocab);
    }
    ScopedKernelTag tag(KernelCategory::norm_elementwise);
    cuda::launch_softmax_cross_entropy_forward(stream_, losses, row_stats, as<Half>(logits),
                                               targets, rows, vocab, stride);
  });
}

void CudaOps::classifier_backward(float* dinp, float* dweight, float* logits,
                                  const float* row_stats, const float* inp, const float* weight,
                                  const int32_t* targets, int rows, int channels, int vocab,
                                  float loss_scale, GradientWrite dinp_write) {
  const int stride = padded_logits_stride(logits, rows, vocab);
  if (stride == 0) {
    Ops::classifier_backward(dinp, dweight, logits, row_stats, inp, weight, targets, rows,
                             channels, vocab, loss_scale, dinp_write);
    return;
  }
  require_fp32(row_stats, "cross-entropy row statistics");
  require_fp32(dweight, "classifier dweight");
  SCALESTUDY_CHECK(stores_half(inp, "classifier inp") && stores_half(dinp, "classifier dinp"),
                   "classifier_backward: inp and dinp must be activation buffers like the logits");
  const void* weight_copy = parameter_copy_of(weight);
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    {
      ScopedKernelTag tag(KernelCategory::norm_elementwise);
      cuda::launch_softmax_cross_entropy_backward(stream_, as<Half>(logits), as<Half>(logits),
                                                  row_stats, targets, rows, vocab, stride,
                                                  loss_scale);
    }
    ScopedKernelTag tag(KernelCategory::gemm);
    cuda::launch_classifier_matmul_backward(cublas_, stream_, as<Half>(dinp), dweight,
                                            as<Half>(logits), stride, as<Half>(inp),
                                            as<Half>(weight_copy), rows, channels, vocab,
                                            dinp_write == GradientWrite::accumulate);
  });
}

double CudaOps::read_device_double() {
  CHECK_CUDA(cudaMemcpyAsync(host_result_, device_result_, sizeof(double),
                             cudaMemcpyDeviceToHost, stream_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  return *host_result_;
}

double CudaOps::sum(const float* x, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  if (stores_half(x, "sum input")) {
    with_half_type(precision_, [&](auto storage) {
      using Half = typename decltype(storage)::type;
      cuda::launch_sum(stream_, device_result_, as<Half>(x), elems, reduction_partials_,
                       reduction_partials_elems_);
    });
  } else {
    cuda::launch_sum(stream_, device_result_, x, elems, reduction_partials_,
                     reduction_partials_elems_);
  }
  return read_device_double();
}

double CudaOps::sum_of_squares(const float* x, size_t elems) {
  ScopedKernelTag tag(KernelCategory::optimizer);
  require_fp32(x, "sum_of_squares input");
  cuda::launch_sum_of_squares(stream_, device_result_, x, elems, reduction_partials_,
                              reduction_partials_elems_);
  return read_device_double();
}

void CudaOps::scale(float* x, size_t elems, float factor) {
  ScopedKernelTag tag(KernelCategory::optimizer);
  require_fp32(x, "scale x");
  cuda::launch_scale(stream_, x, elems, factor);
}

void CudaOps::adamw_update(float* params, const float* grads, float* m, float* v, size_t elems,
                           const AdamWParams& hyper) {
  ScopedKernelTag tag(KernelCategory::optimizer);
  require_fp32(params, "adamw params");
  require_fp32(grads, "adamw grads");
  cuda::launch_adamw_update(stream_, params, grads, m, v, elems, hyper);
}

const CudaOps::AdamWTable& CudaOps::adamw_table_for(const std::vector<AdamWPiece>& pieces) {
  for (const AdamWTable& table : adamw_tables_)
    if (table.pieces == pieces) return table;
  const cuda::AdamWPieceTable made = cuda::make_adamw_piece_table(pieces);
  AdamWTable table{pieces, nullptr, static_cast<int>(made.pieces.size()), made.blocks};
  if (!made.pieces.empty()) {
    const size_t table_bytes = made.pieces.size() * sizeof(cuda::AdamWDevicePiece);
    CHECK_CUDA(cudaMalloc(&table.device, table_bytes));
    // Synchronous, once per distinct range: the host vector may go right after.
    CHECK_CUDA(cudaMemcpy(table.device, made.pieces.data(), table_bytes, cudaMemcpyHostToDevice));
    std::lock_guard<std::mutex> lock(memory_mutex_);
    bytes_by_kind_[static_cast<size_t>(MemoryKind::optimizer)] += table_bytes;
  }
  adamw_tables_.push_back(std::move(table));
  return adamw_tables_.back();
}

bool CudaOps::adamw_update_pieces(float* params, const float* grads, float* m, float* v,
                                  const std::vector<AdamWPiece>& pieces,
                                  const AdamWParams& hyper) {
  ScopedKernelTag tag(KernelCategory::optimizer);
  require_fp32(params, "adamw params");
  require_fp32(grads, "adamw grads");
  const AdamWTable& table = adamw_table_for(pieces);
  // The copy is the backend's own, written here as parameters_changed writes it.
  void* copy = half_mode() ? const_cast<void*>(parameter_copy_or_null(params)) : nullptr;
  if (copy == nullptr) {
    cuda::launch_adamw_update_pieces(stream_, params, grads, m, v, table.device,
                                     table.device_pieces, table.blocks, hyper);
    return false;
  }
  with_half_type(precision_, [&](auto storage) {
    using Half = typename decltype(storage)::type;
    cuda::launch_adamw_update_pieces(stream_, params, grads, m, v, table.device,
                                     table.device_pieces, table.blocks, hyper, static_cast<Half*>(copy));
  });
  return true;
}

}  // namespace scalestudy
