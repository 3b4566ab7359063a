#include "matmul.cuh"

#include "common.cuh"
#include "gemm.cuh"
#include "reductions.cuh"

namespace scalestudy::cuda {
namespace {

// out[n, o] += bias[o]. Addition commutes exactly, so this rounds as the CPU's
// bias + dot does.
__global__ void add_bias_kernel(float* __restrict__ out, const float* __restrict__ bias,
                                int rows, int out_channels) {
  const size_t elems = size_t(rows) * out_channels;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x)
    out[i] += bias[i % out_channels];
}

void check_shape(int rows, int in_channels, int out_channels) {
  check_positive(rows, "matmul rows");
  check_positive(in_channels, "matmul in_channels");
  check_positive(out_channels, "matmul out_channels");
}

}  // namespace

// Column-major view (see gemm.cuh): out^T[OC, N] = W[OC, IC] · inp^T[IC, N].
// weight, row-major [OC, IC], is to cuBLAS W^T [IC, OC] with ld IC: op T gives W.
// inp, row-major [N, IC], is inp^T [IC, N] with ld IC: op N.
// out, row-major [N, OC], is out^T [OC, N] with ld OC.
void launch_matmul_forward(cublasHandle_t handle, cudaStream_t stream, float* out,
                           const float* inp, const float* weight, const float* bias, int rows,
                           int in_channels, int out_channels) {
  check_shape(rows, in_channels, out_channels);
  check_not_null(out, "matmul out");
  check_not_null(inp, "matmul inp");
  check_not_null(weight, "matmul weight");
  check_handle_stream(handle, stream);
  gemm_fp32(handle, CUBLAS_OP_T, CUBLAS_OP_N, out_channels, rows, in_channels, 1.0f, weight,
            in_channels, inp, in_channels, 0.0f, out, out_channels);
  if (bias != nullptr) {
    const size_t elems = size_t(rows) * out_channels;
    add_bias_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(
        out, bias, rows, out_channels);
    CHECK_LAUNCH();
  }
}

size_t matmul_backward_scratch_elems(int rows, int out_channels) {
  return size_t(column_partial_rows(rows)) * size_t(out_channels);
}

// Both GEMMs run with beta = 1, which is what makes them accumulate.
// dinp^T[IC, N] += W^T[IC, OC] · dout^T[OC, N]: weight is W^T with ld IC (op N), dout is
//   dout^T with ld OC (op N), dinp is dinp^T with ld IC.
// dweight^T[IC, OC] += inp^T[IC, N] · dout[N, OC]: inp is inp^T with ld IC (op N), dout
//   is dout^T with ld OC (op T gives dout), dweight is dweight^T with ld IC.
void launch_matmul_backward(cublasHandle_t handle, cudaStream_t stream, float* dinp,
                            float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int rows, int in_channels, int out_channels,
                            float* scratch, size_t scratch_elems) {
  check_shape(rows, in_channels, out_channels);
  check_not_null(dinp, "matmul dinp");
  check_not_null(dweight, "matmul dweight");
  check_not_null(dout, "matmul dout");
  check_not_null(inp, "matmul inp");
  check_not_null(weight, "matmul weight");
  check_handle_stream(handle, stream);
  gemm_fp32(handle, CUBLAS_OP_N, CUBLAS_OP_N, in_channels, rows, out_channels, 1.0f, weight,
            in_channels, dout, out_channels, 1.0f, dinp, in_channels);
  gemm_fp32(handle, CUBLAS_OP_N, CUBLAS_OP_T, in_channels, out_channels, rows, 1.0f, inp,
            in_channels, dout, out_channels, 1.0f, dweight, in_channels);
  if (dbias != nullptr) {
    SCALESTUDY_CHECK(scratch_elems >= matmul_backward_scratch_elems(rows, out_channels),
                     "matmul backward: scratch too small");
    launch_column_sums(stream, dbias, dout, rows, out_channels, scratch, scratch_elems);
  }
}

}  // namespace scalestudy::cuda
