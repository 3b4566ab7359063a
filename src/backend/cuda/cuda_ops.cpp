#include "backend/cuda/cuda_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "adamw.cuh"
#include "backend/cuda/cuda_step_timer.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cuda_storage.h"
#include "backend/cuda/cupti_tracer.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/half_host.h"
#include "core/memory_estimate.h"
#include "cuda_check.h"
#include "elementwise.cuh"
#include "gemm_lt.cuh"
#include "profile/kernel_tag.h"
#include "reductions.cuh"

// The CUDA backend's handles, its device's services, reductions and the optimizer; the
// memory is CudaMemory's (cuda_memory.cpp), the layer ops are in cuda_layer_ops.cpp and
// the GEMM ops in cuda_gemm_ops.cpp.
namespace scalestudy {

using namespace cuda_storage;

CudaOps::CudaOps(int device, Precision precision, GemmAlgos gemm_algos, AttentionKernel attention_kernel,
                 std::shared_ptr<cuda::GemmChooser> gemm_chooser)
    : CudaMemory(device, precision), attention_kernel_(resolve_attention_kernel(attention_kernel)) {
  CHECK_CUDA(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device_));
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
    lt_gemm_ = std::make_unique<cuda::LtGemm>(gemm_algos == GemmAlgos::timed, std::move(gemm_chooser));
    count_bytes(MemoryKind::other, cuda::LtGemm::kWorkspaceBytes);
  }
  if (attention_kernel_ == AttentionKernel::cudnn) {
    SCALESTUDY_CHECK(half_mode(), std::string("cuDNN's fused attention runs in bf16 or fp16; ") + mode_name() +
                                      " keeps the probabilities in memory");
    cudnn_attention_ = std::make_unique<CudnnAttention>(precision_, stream_);
  }

  reduction_partials_elems_ = cuda::reduction_scratch_doubles();
  CHECK_CUDA(cudaMalloc(&reduction_partials_, reduction_partials_elems_ * sizeof(double)));
  CHECK_CUDA(cudaMalloc(&device_result_, sizeof(double)));
  CHECK_CUDA(cudaMallocHost(&host_result_, sizeof(double)));
  count_bytes(MemoryKind::other, (reduction_partials_elems_ + 1) * sizeof(double));
  sample_device_usage();
}

// The overlapped lane's NCCL kernels hold their multiprocessors for as long as a collective
// lasts, and GEMMs sized for the whole device slow down beside them far more than that
// share: their last wave waits for the tiles that the busy multiprocessors would have run.
// Sized for the multiprocessors left, the waves end together. The target must match the
// lane exactly: sized for fewer still, the GEMMs leave multiprocessors idle for the whole
// backward, which costs more than the lane's collectives do.
void CudaOps::reserve_multiprocessors(int count) {
  SCALESTUDY_CHECK(count >= 0 && count < multiprocessors_,
                   "reserve_multiprocessors: " + std::to_string(count) + " of " +
                       std::to_string(multiprocessors_) + " multiprocessors");
  const int target = count > 0 ? multiprocessors_ - count : 0;
  if (target == multiprocessor_target_) return;
  multiprocessor_target_ = target;
  CHECK_CUBLAS(cublasSetSmCountTarget(cublas_, target));
  if (lt_gemm_) lt_gemm_->set_multiprocessor_target(target);
}

cuda::Blas CudaOps::blas() const {
  return {cublas_, lt_gemm_ && lt_gemm_->chooses_plain() ? lt_gemm_.get() : nullptr};
}

// The base's destructor then frees the buffers and the stream.
CudaOps::~CudaOps() {
  CHECK_CUDA(cudaSetDevice(device_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  for (AdamWTable& table : adamw_tables_) CHECK_CUDA(cudaFree(table.device));
  CHECK_CUDA(cudaFree(reduction_partials_));
  CHECK_CUDA(cudaFree(device_result_));
  CHECK_CUDA(cudaFreeHost(host_result_));
  lt_gemm_.reset();
  cudnn_attention_.reset();
  CHECK_CUBLAS(cublasDestroy(cublas_));
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

std::vector<std::string> CudaOps::algorithm_choices() const {
  std::vector<std::string> lines;
  if (lt_gemm_) lines = lt_gemm_->algorithm_report();
  return lines;
}

double CudaOps::read_device_double() {
  CHECK_CUDA(cudaMemcpyAsync(host_result_, device_result_, sizeof(double),
                             cudaMemcpyDeviceToHost, stream_));
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  return *host_result_;
}

double CudaOps::sum(const float* x, size_t elems) {
  ScopedKernelTag tag(KernelCategory::norm_elementwise);
  with_storage_type(stores_half(x, "sum input"), precision_, [&]<class T>(Storage<T>) {
    cuda::launch_sum(stream_, device_result_, as<T>(x), elems, reduction_partials_,
                     reduction_partials_elems_);
  });
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
  require_fp32({{params, "adamw params"}, {grads, "adamw grads"}});
  cuda::launch_adamw_update(stream_, params, grads, m, v, elems, hyper);
}

size_t CudaOps::adamw_pieces_bytes(const std::vector<AdamWPiece>& pieces) const {
  return cuda::make_adamw_piece_table(pieces).pieces.size() * sizeof(cuda::AdamWDevicePiece);
}

const CudaOps::AdamWTable& CudaOps::adamw_table_for(const std::vector<AdamWPiece>& pieces) {
  for (const AdamWTable& table : adamw_tables_)
    if (table.pieces == pieces) return table;
  const cuda::AdamWPieceTable made = cuda::make_adamw_piece_table(pieces);
  AdamWTable table{pieces, nullptr, static_cast<int>(made.pieces.size()), made.blocks};
  if (!made.pieces.empty()) {
    const size_t table_bytes = adamw_pieces_bytes(pieces);
    CHECK_CUDA(cudaMalloc(&table.device, table_bytes));
    // Synchronous, once per distinct range: the host vector may go right after.
    CHECK_CUDA(cudaMemcpy(table.device, made.pieces.data(), table_bytes, cudaMemcpyHostToDevice));
    count_bytes(MemoryKind::optimizer, table_bytes);
  }
  adamw_tables_.push_back(std::move(table));
  return adamw_tables_.back();
}

bool CudaOps::adamw_update_pieces(float* params, const float* grads, float* m, float* v,
                                  const std::vector<AdamWPiece>& pieces,
                                  const AdamWParams& hyper) {
  ScopedKernelTag tag(KernelCategory::optimizer);
  require_fp32({{params, "adamw params"}, {grads, "adamw grads"}});
  const AdamWTable& table = adamw_table_for(pieces);
  // The copy is the backend's own, written here as parameters_changed writes it.
  void* copy = half_mode() ? const_cast<void*>(parameter_copy_or_null(params)) : nullptr;
  const AdamWTensors tensors{.params = params, .grads = grads, .m = m, .v = v};
  const cuda::AdamWDeviceTable device_table{
      .pieces = table.device, .count = table.device_pieces, .blocks = table.blocks};
  if (copy == nullptr) {
    cuda::launch_adamw_update_pieces(stream_, tensors, device_table, hyper);
    return false;
  }
  with_half_type(precision_, [&]<class Half>(Storage<Half>) {
    cuda::launch_adamw_update_pieces(stream_, tensors, device_table, hyper, static_cast<Half*>(copy));
  });
  return true;
}

}  // namespace scalestudy
