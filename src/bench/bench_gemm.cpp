#include "bench/benchmarks.h"

#include <cstring>
#include <memory>

#include "bench/bench_gpt.h"
#include "bench/bench_model.h"
#include "bench/bench_point.h"
#include "core/check.h"
#include "profile/kernel_tag.h"

#if SCALESTUDY_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"
#include "cuda_check.h"
#endif

namespace scalestudy {
namespace {

constexpr uint64_t kSeedA = 11, kSeedB = 12;

// peers/bench_gpu_vs_torch.py reads the ok line's median and TFLOP/s.
void report(BenchContext& context, size_t row) {
  const PointTable& t = context.table;
  const std::string point = "gemm " + t.text(row, "precision") + " n=" + std::to_string(t.integer(row, "n"));
  report_row(context, row, point,
             time_text(t, row, "median", "ms") + format_text(", %.4g TFLOP/s", t.number(row, "tflops")));
}

void run_cpu_point(BenchContext& context, size_t row, int64_t n) {
  Backend& backend = context.backend;
  const size_t elems = static_cast<size_t>(n) * static_cast<size_t>(n);
  // matmul_forward computes out = inp · weightᵀ: the same n³ multiply-adds as A·B.
  float* inp = allocate_random(backend, elems, MemoryKind::activations, kSeedA);
  float* weight = allocate_random(backend, elems, MemoryKind::parameters, kSeedB);
  float* out = backend.allocate_floats(elems, MemoryKind::activations);
  const int size = static_cast<int>(n);
  time_flops_row(context, row, [&] {
    backend.matmul_forward({.out = out, .inp = inp, .weight = weight, .rows = size,
                            .in_channels = size, .out_channels = size});
  });
  for (float* buffer : {inp, weight, out}) backend.release(buffer);
}

#if SCALESTUDY_HAVE_CUDA

struct CudaGemmType {
  cudaDataType_t data;
  cublasComputeType_t compute;
};

CudaGemmType cuda_gemm_type(const std::string& precision) {
  if (precision == "tf32") return {CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
  if (precision == "fp16") return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
  if (precision == "bf16") return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
  return {CUDA_R_32F, CUBLAS_COMPUTE_32F};
}

// Device memory that a failed allocation leaves empty instead of ending the job: a GEMM
// too large for the device is a point marked oom.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool allocate(size_t bytes) {
    if (cudaMalloc(&ptr_, bytes) == cudaSuccess) return true;
    (void)cudaGetLastError();  // or the next launch check would report this failure
    ptr_ = nullptr;
    return false;
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// Converts the fp32 host values to the precision's storage type and uploads them on the
// compute stream, waiting until they have landed (a pageable cudaMemcpy may return
// before its DMA is done, and the legacy stream does not order a non-blocking one).
void upload(cudaStream_t stream, void* device, const std::vector<float>& values, const std::string& precision) {
  if (precision == "fp16" || precision == "bf16") {
    std::vector<uint16_t> converted(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      if (precision == "fp16") {
        const __half h = __float2half_rn(values[i]);
        std::memcpy(&converted[i], &h, sizeof(uint16_t));
      } else {
        const __nv_bfloat16 b = __float2bfloat16_rn(values[i]);
        std::memcpy(&converted[i], &b, sizeof(uint16_t));
      }
    }
    CHECK_CUDA(cudaMemcpyAsync(device, converted.data(), converted.size() * sizeof(uint16_t),
                               cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    return;
  }
  CHECK_CUDA(cudaMemcpyAsync(device, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
}

// A cuBLAS handle of the benchmark's own on the backend's compute stream, with an
// explicit 32 MiB workspace (what PyTorch gives cuBLAS on Hopper), so that the algorithm
// choice does not depend on another handle's settings.
class CudaGemm {
 public:
  explicit CudaGemm(cudaStream_t stream) {
    CHECK_CUBLAS(cublasCreate(&handle_));
    CHECK_CUBLAS(cublasSetStream(handle_, stream));
    CHECK_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
    CHECK_CUBLAS(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
  }
  ~CudaGemm() {
    cublasDestroy(handle_);
    cudaFree(workspace_);
  }
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

  // C = A·B, all n×n column-major; alpha and beta are fp32 for every precision because
  // every compute type here accumulates in fp32.
  void run(const std::string& precision, int n, const void* a, const void* b, void* c) {
    const CudaGemmType type = cuda_gemm_type(precision);
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, type.data, n, b, type.data, n,
                              &beta, c, type.data, n, type.compute, CUBLAS_GEMM_DEFAULT));
  }

 private:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  cublasHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

void run_cuda_point(BenchContext& context, CudaGemm& gemm, size_t row, const std::string& precision, int64_t n,
                    const std::vector<float>& host_a, const std::vector<float>& host_b) {
  const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(n) *
                       static_cast<size_t>(gemm_element_bytes(precision));
  DeviceBuffer a, b, c;
  if (!a.allocate(bytes) || !b.allocate(bytes) || !c.allocate(bytes)) {
    context.table.set_status(row, PointStatus::oom, "cudaMalloc of the three matrices failed");
    return;
  }
  const cudaStream_t stream = dynamic_cast<CudaOps&>(context.backend).stream();
  upload(stream, a.get(), host_a, precision);
  upload(stream, b.get(), host_b, precision);
  const int size = static_cast<int>(n);
  time_flops_row(context, row, [&] {
    ScopedKernelTag tag(KernelCategory::gemm);
    gemm.run(precision, size, a.get(), b.get(), c.get());
  });
  context.backend.synchronize();
}

#endif

}  // namespace

double gemm_element_bytes(const std::string& precision) {
  return precision == "fp16" || precision == "bf16" ? 2.0 : 4.0;
}

void run_gemm_bench(BenchContext& context) {
  const BenchConfig& config = context.config;
  PointTable& table = context.table;
  table.add_text("precision", "fp32, tf32 (fp32 storage, TF32 tensor cores), fp16 or bf16 (fp32 accumulation)");
  table.add_int("n", "", "the matrices are n×n: C[n,n] = A[n,n]·B[n,n]");
  add_work_columns(table, "2·n³", "3·n²·element bytes: A and B read once, C written once");
  const bool cuda = context.backend.name() == "cuda";
  context.method["kernel"] = cuda ? "cublasGemmEx, CUBLAS_GEMM_DEFAULT, 32 MiB workspace, column-major NN"
                                  : "CpuOps::matmul_forward (out = inp·weightᵀ, fp32, single thread)";
  context.method["inputs"] = "uniform random values in ±[0.25, 1), never zero";
  context.method["flop_model"] = "2·n³ per product";
  context.method["byte_model"] = "3·n² elements: A and B read once, C written once";

#if SCALESTUDY_HAVE_CUDA
  std::unique_ptr<CudaGemm> gemm;
  if (cuda) gemm = std::make_unique<CudaGemm>(dynamic_cast<CudaOps&>(context.backend).stream());
#endif
  for (int64_t n : config.gemm_sizes) {
    std::vector<float> host_a, host_b;  // drawn once per size, shared by the precisions
    for (const std::string& precision : config.precisions) {
      const size_t row = table.add_row();
      const double bytes = bench_model::gemm_bytes(static_cast<double>(n), gemm_element_bytes(precision));
      table.set(row, "precision", precision);
      table.set(row, "n", n);
      set_work(table, row, bench_model::gemm_flops(static_cast<double>(n)), bytes);
      const size_t needed = static_cast<size_t>(bytes);
      if (!cuda && precision != "fp32") {
        skip_point(context, {row}, PointStatus::unavailable, "not available on cpu", report);
        continue;
      }
      if (!point_fits(context, {row}, needed, "needs " + std::to_string(needed) + " bytes and head-room", report))
        continue;
      if (!cuda) {
        run_cpu_point(context, row, n);
      } else {
#if SCALESTUDY_HAVE_CUDA
        const size_t elems = static_cast<size_t>(n) * static_cast<size_t>(n);
        if (host_a.empty()) {
          host_a = random_nonzero(elems, kSeedA);
          host_b = random_nonzero(elems, kSeedB);
        }
        run_cuda_point(context, *gemm, row, precision, n, host_a, host_b);
#endif
      }
      report(context, row);
    }
  }
}

}  // namespace scalestudy
