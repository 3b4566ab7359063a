#include "embedding.cuh"

#include <cmath>

#include "common.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

struct EmbeddingParams {
  int batch, seq, channels;
};

// T is the storage of out (fp32, bf16 or fp16); the tables are fp32 master weights, and the
// sum is one fp32 addition rounded once to T.
template <class T>
__global__ void embedding_forward_kernel(T* __restrict__ out,
                                         const int32_t* __restrict__ tokens,
                                         const float* __restrict__ wte,
                                         const float* __restrict__ wpe, EmbeddingParams p) {
  const size_t elems = size_t(p.batch) * p.seq * p.channels;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t row = i / p.channels;
    const int c = static_cast<int>(i - row * p.channels);
    const int t = static_cast<int>(row % p.seq);
    const int32_t token = tokens[row];
    out[i] = from_float<T>(token >= 0 ? wte[size_t(token) * p.channels + c] +
                                            wpe[size_t(t) * p.channels + c]
                                      : NAN);
  }
}

// One thread per (t, c): the batch rows of one position are summed in increasing b.
// T is the storage of dout; the gradients are fp32 and accumulate in fp32.
template <class T>
__global__ void embedding_backward_wpe_kernel(float* __restrict__ dwpe,
                                              const T* __restrict__ dout,
                                              EmbeddingParams p) {
  const size_t elems = size_t(p.seq) * p.channels;
  const size_t batch_stride = size_t(p.seq) * p.channels;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x) {
    float total = dwpe[i];
    for (int b = 0; b < p.batch; ++b) total += to_float(dout[b * batch_stride + i]);
    dwpe[i] = total;
  }
}

constexpr int kWteThreads = 256;

// Repeated tokens would make a row-parallel scatter race. Instead one block per row n
// decides whether n is the first occurrence of its token (the row's "leader"); only the
// leader's block writes that dwte row, adding the dout rows of every occurrence in
// increasing n. No atomics, a fixed order, and work proportional to the distinct tokens;
// the price is that each block scans the token array, which is small and cache-resident.
template <class T>
__global__ void embedding_backward_wte_kernel(float* __restrict__ dwte,
                                              const T* __restrict__ dout,
                                              const int32_t* __restrict__ tokens, int rows,
                                              int channels) {
  __shared__ int matches[kWteThreads];
  __shared__ int warp_counts[kWteThreads / kWarpSize];
  const int n = blockIdx.x;
  const int32_t token = tokens[n];
  if (token < 0) return;
  for (int start = 0; start < n; start += blockDim.x) {
    const int r = start + threadIdx.x;
    const bool earlier = r < n && tokens[r] == token;
    if (__syncthreads_or(earlier)) return;
  }

  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  float* dwte_row = dwte + size_t(token) * channels;
  for (int start = n; start < rows; start += blockDim.x) {
    const int r = start + threadIdx.x;
    const bool hit = r < rows && tokens[r] == token;
    const unsigned ballot = __ballot_sync(kFullWarpMask, hit);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    // The matches of this tile, compacted in increasing row order.
    int offset = 0, total = 0;
    for (int w = 0; w < warps; ++w) {
      offset += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    if (hit) matches[offset + __popc(ballot & ((1u << lane) - 1u))] = r;
    __syncthreads();
    if (total > 0) {
      for (int c = threadIdx.x; c < channels; c += blockDim.x) {
        float value = dwte_row[c];
        for (int k = 0; k < total; ++k)
          value += to_float(dout[size_t(matches[k]) * channels + c]);
        dwte_row[c] = value;
      }
    }
    // matches and warp_counts are rewritten by the next tile.
    __syncthreads();
  }
}

void check_shape(int batch, int seq, int channels) {
  check_positive(batch, "embedding batch");
  check_positive(seq, "embedding seq");
  check_positive(channels, "embedding channels");
  SCALESTUDY_CHECK(static_cast<long long>(batch) * seq < (1ll << 31),
                   "embedding: batch*seq must fit in an int");
}

template <class T>
void embedding_forward(cudaStream_t stream, T* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int batch, int seq, int channels) {
  check_shape(batch, seq, channels);
  check_not_null(out, "embedding out");
  check_not_null(tokens, "embedding tokens");
  check_not_null(wte, "embedding wte");
  check_not_null(wpe, "embedding wpe");
  const EmbeddingParams p{batch, seq, channels};
  const size_t elems = size_t(batch) * seq * channels;
  embedding_forward_kernel<T><<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(
      out, tokens, wte, wpe, p);
  CHECK_LAUNCH();
}

template <class T>
void embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const T* dout,
                        const int32_t* tokens, int batch, int seq, int channels) {
  check_shape(batch, seq, channels);
  check_not_null(dwte, "embedding dwte");
  check_not_null(dwpe, "embedding dwpe");
  check_not_null(dout, "embedding dout");
  check_not_null(tokens, "embedding tokens");
  const EmbeddingParams p{batch, seq, channels};
  const size_t position_elems = size_t(seq) * channels;
  embedding_backward_wpe_kernel<T><<<elementwise_blocks(position_elems), kElementwiseThreads,
                                     0, stream>>>(dwpe, dout, p);
  CHECK_LAUNCH();
  embedding_backward_wte_kernel<T><<<batch * seq, kWteThreads, 0, stream>>>(
      dwte, dout, tokens, batch * seq, channels);
  CHECK_LAUNCH();
}

}  // namespace

void launch_embedding_forward(cudaStream_t stream, float* out, const int32_t* tokens,
                              const float* wte, const float* wpe, int batch, int seq,
                              int channels) {
  embedding_forward(stream, out, tokens, wte, wpe, batch, seq, channels);
}

void launch_embedding_forward(cudaStream_t stream, bf16* out, const int32_t* tokens,
                              const float* wte, const float* wpe, int batch, int seq,
                              int channels) {
  embedding_forward(stream, out, tokens, wte, wpe, batch, seq, channels);
}

void launch_embedding_forward(cudaStream_t stream, fp16* out, const int32_t* tokens,
                              const float* wte, const float* wpe, int batch, int seq,
                              int channels) {
  embedding_forward(stream, out, tokens, wte, wpe, batch, seq, channels);
}

void launch_embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const float* dout,
                               const int32_t* tokens, int batch, int seq, int channels) {
  embedding_backward(stream, dwte, dwpe, dout, tokens, batch, seq, channels);
}

void launch_embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const bf16* dout,
                               const int32_t* tokens, int batch, int seq, int channels) {
  embedding_backward(stream, dwte, dwpe, dout, tokens, batch, seq, channels);
}

void launch_embedding_backward(cudaStream_t stream, float* dwte, float* dwpe, const fp16* dout,
                               const int32_t* tokens, int batch, int seq, int channels) {
  embedding_backward(stream, dwte, dwpe, dout, tokens, batch, seq, channels);
}

}  // namespace scalestudy::cuda
