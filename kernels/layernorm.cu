#include "layernorm.cuh"

#include "common.cuh"
#include "precision.cuh"
#include "reductions.cuh"

namespace scalestudy::cuda {
namespace {

constexpr double kLayerNormEpsilon = 1e-5;
constexpr int kRowThreads = 128;
constexpr int kColumnTile = 32;
constexpr int kColumnRowLanes = 8;

// T is the storage of the activations (inp, out, dout, dinp): fp32, bf16 or fp16. weight, bias,
// mean, rstd and the parameter gradients are fp32 whatever T is.
template <class T>
struct LayerNormForwardParams {
  T* out;
  float* mean;
  float* rstd;
  const T* inp;
  const float* weight;
  const float* bias;
  int channels;
};

template <class T>
struct LayerNormBackwardParams {
  T* dinp;
  const T* dout;
  const T* inp;
  const float* weight;
  const float* mean;
  const float* rstd;
  int rows;
  int channels;
};

// The __f*_rn intrinsics below are never fused into multiply-adds, so each per-element
// expression rounds exactly as the CPU reference's does, and the GPU-vs-CPU comparison
// only sees the difference in reduction order (and, in bf16 or fp16, the final rounding).

// One block per row. Mean and variance accumulate in double (two passes; the second
// reads the row from L1), as the CPU does: with C in the thousands an fp32 sum would
// lose the digits that x - mean needs.
template <class T>
__global__ void layernorm_forward_kernel(LayerNormForwardParams<T> p) {
  __shared__ double shared[kWarpSize];
  const int row = blockIdx.x;
  const T* x = p.inp + size_t(row) * p.channels;
  T* y = p.out + size_t(row) * p.channels;
  double total = 0.0;
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) total += to_float(x[c]);
  const double row_mean = block_reduce_sum(total, shared) / p.channels;
  double squared = 0.0;
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const double centered = to_float(x[c]) - row_mean;
    squared += centered * centered;
  }
  const double variance = block_reduce_sum(squared, shared) / p.channels;
  const double row_rstd = 1.0 / sqrt(variance + kLayerNormEpsilon);
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const float normed = static_cast<float>((to_float(x[c]) - row_mean) * row_rstd);
    y[c] = from_float<T>(__fadd_rn(__fmul_rn(normed, p.weight[c]), p.bias[c]));
  }
  if (threadIdx.x == 0) {
    p.mean[row] = static_cast<float>(row_mean);
    p.rstd[row] = static_cast<float>(row_rstd);
  }
}

// One block per row: the input gradient, after the two projections that normalisation
// removes (the mean of dnorm, and its component along the normalised input).
template <class T>
__global__ void layernorm_backward_input_kernel(LayerNormBackwardParams<T> p) {
  __shared__ double shared[kWarpSize];
  const int row = blockIdx.x;
  const size_t offset = size_t(row) * p.channels;
  const T* x = p.inp + offset;
  const T* dy = p.dout + offset;
  T* dx = p.dinp + offset;
  const float row_mean = p.mean[row];
  const float row_rstd = p.rstd[row];
  double dnorm_total = 0.0, dnorm_dot_norm = 0.0;
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const float normed = __fmul_rn(to_float(x[c]) - row_mean, row_rstd);
    const float dnorm = __fmul_rn(p.weight[c], to_float(dy[c]));
    dnorm_total += dnorm;
    dnorm_dot_norm += static_cast<double>(dnorm) * normed;
  }
  const float dnorm_mean = static_cast<float>(block_reduce_sum(dnorm_total, shared) / p.channels);
  const float dnorm_norm_mean =
      static_cast<float>(block_reduce_sum(dnorm_dot_norm, shared) / p.channels);
  for (int c = threadIdx.x; c < p.channels; c += blockDim.x) {
    const float normed = __fmul_rn(to_float(x[c]) - row_mean, row_rstd);
    const float dnorm = __fmul_rn(p.weight[c], to_float(dy[c]));
    const float centered = __fsub_rn(dnorm - dnorm_mean, __fmul_rn(normed, dnorm_norm_mean));
    dx[c] = from_float<T>(__fadd_rn(to_float(dx[c]), __fmul_rn(row_rstd, centered)));
  }
}

// Per-chunk column partials of dweight (normed * dy) and dbias (dy), in the layout that
// launch_add_column_partials reduces. Block (kColumnTile, kColumnRowLanes).
template <class T>
__global__ void layernorm_backward_param_partials_kernel(float* __restrict__ weight_partials,
                                                         float* __restrict__ bias_partials,
                                                         LayerNormBackwardParams<T> p) {
  __shared__ float weight_tile[kColumnRowLanes][kColumnTile + 1];
  __shared__ float bias_tile[kColumnRowLanes][kColumnTile + 1];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int chunk = blockIdx.y;
  const int row_end = min(p.rows, (chunk + 1) * kColumnChunkRows);
  float weight_total = 0.0f, bias_total = 0.0f;
  if (c < p.channels) {
    for (int r = chunk * kColumnChunkRows + threadIdx.y; r < row_end; r += kColumnRowLanes) {
      const size_t at = size_t(r) * p.channels + c;
      const float normed = __fmul_rn(to_float(p.inp[at]) - p.mean[r], p.rstd[r]);
      const float dy = to_float(p.dout[at]);
      bias_total += dy;
      weight_total = __fadd_rn(weight_total, __fmul_rn(normed, dy));
    }
  }
  weight_tile[threadIdx.y][threadIdx.x] = weight_total;
  bias_tile[threadIdx.y][threadIdx.x] = bias_total;
  __syncthreads();
  if (threadIdx.y == 0 && c < p.channels) {
    float weight_sum = weight_tile[0][threadIdx.x], bias_sum = bias_tile[0][threadIdx.x];
    for (int lane = 1; lane < kColumnRowLanes; ++lane) {
      weight_sum += weight_tile[lane][threadIdx.x];
      bias_sum += bias_tile[lane][threadIdx.x];
    }
    weight_partials[size_t(chunk) * p.channels + c] = weight_sum;
    bias_partials[size_t(chunk) * p.channels + c] = bias_sum;
  }
}

void check_shape(int rows, int channels) {
  check_positive(rows, "layernorm rows");
  check_positive(channels, "layernorm channels");
}

template <class T>
void layernorm_forward(cudaStream_t stream, T* out, float* mean, float* rstd, const T* inp,
                       const float* weight, const float* bias, int rows, int channels) {
  check_shape(rows, channels);
  check_not_null(out, "layernorm out");
  check_not_null(mean, "layernorm mean");
  check_not_null(rstd, "layernorm rstd");
  check_not_null(inp, "layernorm inp");
  check_not_null(weight, "layernorm weight");
  check_not_null(bias, "layernorm bias");
  const LayerNormForwardParams<T> p{out, mean, rstd, inp, weight, bias, channels};
  layernorm_forward_kernel<T><<<rows, kRowThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

template <class T>
void layernorm_backward(cudaStream_t stream, T* dinp, float* dweight, float* dbias,
                        const T* dout, const T* inp, const float* weight, const float* mean,
                        const float* rstd, int rows, int channels, float* scratch,
                        size_t scratch_elems) {
  check_shape(rows, channels);
  check_not_null(dinp, "layernorm dinp");
  check_not_null(dweight, "layernorm dweight");
  check_not_null(dbias, "layernorm dbias");
  check_not_null(dout, "layernorm dout");
  check_not_null(inp, "layernorm inp");
  check_not_null(weight, "layernorm weight");
  check_not_null(mean, "layernorm mean");
  check_not_null(rstd, "layernorm rstd");
  check_not_null(scratch, "layernorm scratch");
  SCALESTUDY_CHECK(scratch_elems >= layernorm_backward_scratch_elems(rows, channels),
                   "layernorm backward: scratch too small");
  const int partial_rows = column_partial_rows(rows);
  SCALESTUDY_CHECK(partial_rows <= 65535, "layernorm backward: too many rows for the grid");
  const LayerNormBackwardParams<T> p{dinp, dout, inp, weight, mean, rstd, rows, channels};

  layernorm_backward_input_kernel<T><<<rows, kRowThreads, 0, stream>>>(p);
  CHECK_LAUNCH();

  float* weight_partials = scratch;
  float* bias_partials = scratch + size_t(partial_rows) * channels;
  const dim3 grid((channels + kColumnTile - 1) / kColumnTile, partial_rows);
  const dim3 block(kColumnTile, kColumnRowLanes);
  layernorm_backward_param_partials_kernel<T><<<grid, block, 0, stream>>>(weight_partials,
                                                                          bias_partials, p);
  CHECK_LAUNCH();
  launch_add_column_partials(stream, dweight, weight_partials, partial_rows, channels);
  launch_add_column_partials(stream, dbias, bias_partials, partial_rows, channels);
}

}  // namespace

void launch_layernorm_forward(cudaStream_t stream, float* out, float* mean, float* rstd,
                              const float* inp, const float* weight, const float* bias, int rows,
                              int channels) {
  layernorm_forward(stream, out, mean, rstd, inp, weight, bias, rows, channels);
}

void launch_layernorm_forward(cudaStream_t stream, bf16* out, float* mean, float* rstd,
                              const bf16* inp, const float* weight, const float* bias, int rows,
                              int channels) {
  layernorm_forward(stream, out, mean, rstd, inp, weight, bias, rows, channels);
}

void launch_layernorm_forward(cudaStream_t stream, fp16* out, float* mean, float* rstd,
                              const fp16* inp, const float* weight, const float* bias, int rows,
                              int channels) {
  layernorm_forward(stream, out, mean, rstd, inp, weight, bias, rows, channels);
}

size_t layernorm_backward_scratch_elems(int rows, int channels) {
  return 2 * size_t(column_partial_rows(rows)) * size_t(channels);
}

void launch_layernorm_backward(cudaStream_t stream, float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp, const float* weight,
                               const float* mean, const float* rstd, int rows, int channels,
                               float* scratch, size_t scratch_elems) {
  layernorm_backward(stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels,
                     scratch, scratch_elems);
}

void launch_layernorm_backward(cudaStream_t stream, bf16* dinp, float* dweight, float* dbias,
                               const bf16* dout, const bf16* inp, const float* weight,
                               const float* mean, const float* rstd, int rows, int channels,
                               float* scratch, size_t scratch_elems) {
  layernorm_backward(stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels,
                     scratch, scratch_elems);
}

void launch_layernorm_backward(cudaStream_t stream, fp16* dinp, float* dweight, float* dbias,
                               const fp16* dout, const fp16* inp, const float* weight,
                               const float* mean, const float* rstd, int rows, int channels,
                               float* scratch, size_t scratch_elems) {
  layernorm_backward(stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels,
                     scratch, scratch_elems);
}

}  // namespace scalestudy::cuda

