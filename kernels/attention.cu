#include "attention.cuh"

#include <cmath>
#include <string>

#include "common.cuh"
#include "gemm.cuh"

namespace scalestudy::cuda {
namespace {

// Rows are T long (up to a few thousand): 128 threads give each a handful of elements.
constexpr int kRowThreads = 128;

struct SoftmaxParams {
  float* probs;        // in: scaled scores; out: probabilities (in place)
  int seq;
  bool causal;
};

struct SoftmaxBackwardParams {
  float* dscores;      // in: d(probs); out: d(scores) (in place)
  const float* probs;
  int seq;
  bool causal;
  float score_scale;
};

// One block per (b, h, t) row. Each thread reads and then overwrites only its own
// elements, with the block reductions in between, so the update can be in place.
// Masked keys become exact zeros, as on the CPU, so that every row is a full
// distribution over T for the PV product and the backward.
__global__ void attention_softmax_kernel(SoftmaxParams p) {
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  const size_t row = blockIdx.x;
  const int t = static_cast<int>(row % p.seq);
  const int key_count = p.causal ? t + 1 : p.seq;
  float* scores = p.probs + row * p.seq;
  float max_score = -INFINITY;
  for (int t2 = threadIdx.x; t2 < key_count; t2 += blockDim.x)
    max_score = fmaxf(max_score, scores[t2]);
  max_score = block_reduce_max(max_score, shared_max);
  double exp_total = 0.0;
  for (int t2 = threadIdx.x; t2 < key_count; t2 += blockDim.x)
    exp_total += expf(scores[t2] - max_score);
  exp_total = block_reduce_sum(exp_total, shared_sum);
  const float inverse_total = static_cast<float>(1.0 / exp_total);
  for (int t2 = threadIdx.x; t2 < p.seq; t2 += blockDim.x)
    scores[t2] = t2 < key_count ? __fmul_rn(expf(scores[t2] - max_score), inverse_total) : 0.0f;
}

// dscore = p * (dp - sum_t3 p[t3] dp[t3]) * scale, the O(T) form of the softmax
// backward, rounded step by step as on the CPU. Masked entries become exact zeros
// whatever the GEMM left there.
__global__ void attention_softmax_backward_kernel(SoftmaxBackwardParams p) {
  __shared__ double shared_sum[kWarpSize];
  const size_t row = blockIdx.x;
  const int t = static_cast<int>(row % p.seq);
  const int key_count = p.causal ? t + 1 : p.seq;
  const float* prob_row = p.probs + row * p.seq;
  float* grads = p.dscores + row * p.seq;
  double weighted_total = 0.0;
  for (int t2 = threadIdx.x; t2 < key_count; t2 += blockDim.x)
    weighted_total += static_cast<double>(prob_row[t2]) * grads[t2];
  const float dprob_mean = static_cast<float>(block_reduce_sum(weighted_total, shared_sum));
  for (int t2 = threadIdx.x; t2 < p.seq; t2 += blockDim.x) {
    grads[t2] = t2 < key_count
                    ? __fmul_rn(__fmul_rn(prob_row[t2], __fsub_rn(grads[t2], dprob_mean)),
                                p.score_scale)
                    : 0.0f;
  }
}

int head_size_of(const AttentionShape& shape) {
  check_positive(shape.batch, "attention batch");
  check_positive(shape.seq, "attention seq");
  check_positive(shape.heads, "attention heads");
  SCALESTUDY_CHECK(shape.channels > 0 && shape.channels % shape.heads == 0,
                   "attention channels " + std::to_string(shape.channels) +
                       " must be a positive multiple of heads " + std::to_string(shape.heads));
  SCALESTUDY_CHECK(static_cast<long long>(shape.batch) * shape.heads * shape.seq < (1ll << 31),
                   "attention: batch*heads*seq rows must fit in a grid dimension");
  SCALESTUDY_CHECK(3ll * shape.channels < (1ll << 31), "attention: 3*channels must fit in an int");
  return shape.channels / shape.heads;
}

float score_scale_of(int head_size) {
  return 1.0f / std::sqrt(static_cast<float>(head_size));
}

}  // namespace

// Per batch b, one strided-batched GEMM over the NH heads. Head h of Q, K or V is the
// row-major [T, hs] matrix at qkv + b*T*3C + part*C + h*hs with row stride 3C, so the
// heads are hs apart and no permuted copy is needed. In cuBLAS's column-major view
// (gemm.cuh), each such head is its transpose [hs, T] with ld 3C.
//   scores:  S^T[T2, T] = K[T2, hs] · Q^T[hs, T]   (K: op T, Q: op N), alpha = 1/sqrt(hs),
//            written as probs row-major [T, T2] (ld T), heads T*T apart.
//   outputs: Y^T[hs, T] = V^T[hs, T2] · P^T[T2, T]  (V: op N, P: op N), written into
//            out row-major [T, C] at column h*hs (ld C), heads hs apart.
void launch_attention_forward(cublasHandle_t handle, cudaStream_t stream, float* out,
                              float* probs, const float* qkv, const AttentionShape& shape) {
  const int head_size = head_size_of(shape);
  check_not_null(out, "attention out");
  check_not_null(probs, "attention probs");
  check_not_null(qkv, "attention qkv");
  check_handle_stream(handle, stream);
  const int T = shape.seq, C = shape.channels, NH = shape.heads;
  const int qkv_ld = 3 * C;
  const long long head_stride = head_size;
  const long long probs_head_stride = static_cast<long long>(T) * T;
  for (int b = 0; b < shape.batch; ++b) {
    const float* query = qkv + size_t(b) * T * qkv_ld;
    const float* key = query + C;
    float* probs_batch = probs + size_t(b) * NH * probs_head_stride;
    gemm_fp32_strided_batched(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, head_size,
                              score_scale_of(head_size), key, qkv_ld, head_stride, query, qkv_ld,
                              head_stride, 0.0f, probs_batch, T, probs_head_stride, NH);
  }
  const SoftmaxParams softmax{probs, T, shape.causal};
  attention_softmax_kernel<<<shape.batch * NH * T, kRowThreads, 0, stream>>>(softmax);
  CHECK_LAUNCH();
  for (int b = 0; b < shape.batch; ++b) {
    const float* value = qkv + size_t(b) * T * qkv_ld + 2 * C;
    const float* probs_batch = probs + size_t(b) * NH * probs_head_stride;
    float* out_batch = out + size_t(b) * T * C;
    gemm_fp32_strided_batched(handle, CUBLAS_OP_N, CUBLAS_OP_N, head_size, T, T, 1.0f, value,
                              qkv_ld, head_stride, probs_batch, T, probs_head_stride, 0.0f,
                              out_batch, C, head_stride, NH);
  }
}

size_t attention_backward_scratch_elems(const AttentionShape& shape) {
  return size_t(shape.batch) * shape.heads * shape.seq * shape.seq;
}

// Same views as the forward; all four GEMMs into dqkv run with beta = 1 (accumulate).
//   dP^T[T2, T] = V[T2, hs] · dY^T[hs, T]      (V: op T, dY: op N, dY ld C)   -> scratch
//   dV^T[hs, T2] += dY^T[hs, T] · P[T, T2]     (dY: op N, P: op T)
//   (softmax backward turns dP into dS in scratch)
//   dQ^T[hs, T] += K^T[hs, T2] · dS^T[T2, T]   (K: op N, dS: op N)
//   dK^T[hs, T2] += Q^T[hs, T] · dS[T, T2]     (Q: op N, dS: op T)
void launch_attention_backward(cublasHandle_t handle, cudaStream_t stream, float* dqkv,
                               const float* dout, const float* qkv, const float* probs,
                               const AttentionShape& shape, float* scratch,
                               size_t scratch_elems) {
  const int head_size = head_size_of(shape);
  check_not_null(dqkv, "attention dqkv");
  check_not_null(dout, "attention dout");
  check_not_null(qkv, "attention qkv");
  check_not_null(probs, "attention probs");
  check_not_null(scratch, "attention scratch");
  SCALESTUDY_CHECK(scratch_elems >= attention_backward_scratch_elems(shape),
                   "attention backward: scratch too small");
  check_handle_stream(handle, stream);
  const int T = shape.seq, C = shape.channels, NH = shape.heads;
  const int qkv_ld = 3 * C;
  const long long head_stride = head_size;
  const long long probs_head_stride = static_cast<long long>(T) * T;
  for (int b = 0; b < shape.batch; ++b) {
    const float* value = qkv + size_t(b) * T * qkv_ld + 2 * C;
    const float* dout_batch = dout + size_t(b) * T * C;
    const float* probs_batch = probs + size_t(b) * NH * probs_head_stride;
    float* dprobs_batch = scratch + size_t(b) * NH * probs_head_stride;
    float* dvalue = dqkv + size_t(b) * T * qkv_ld + 2 * C;
    gemm_fp32_strided_batched(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, head_size, 1.0f, value,
                              qkv_ld, head_stride, dout_batch, C, head_stride, 0.0f,
                              dprobs_batch, T, probs_head_stride, NH);
    gemm_fp32_strided_batched(handle, CUBLAS_OP_N, CUBLAS_OP_T, head_size, T, T, 1.0f,
                              dout_batch, C, head_stride, probs_batch, T, probs_head_stride,
                              1.0f, dvalue, qkv_ld, head_stride, NH);
  }
  const SoftmaxBackwardParams softmax{scratch, probs, T, shape.causal, score_scale_of(head_size)};
  attention_softmax_backward_kernel<<<shape.batch * NH * T, kRowThreads, 0, stream>>>(softmax);
  CHECK_LAUNCH();
  for (int b = 0; b < shape.batch; ++b) {
    const float* query = qkv + size_t(b) * T * qkv_ld;
    const float* key = query + C;
    const float* dscores_batch = scratch + size_t(b) * NH * probs_head_stride;
    float* dquery = dqkv + size_t(b) * T * qkv_ld;
    float* dkey = dquery + C;
    gemm_fp32_strided_batched(handle, CUBLAS_OP_N, CUBLAS_OP_N, head_size, T, T, 1.0f, key,
                              qkv_ld, head_stride, dscores_batch, T, probs_head_stride, 1.0f,
                              dquery, qkv_ld, head_stride, NH);
    gemm_fp32_strided_batched(handle, CUBLAS_OP_N, CUBLAS_OP_T, head_size, T, T, 1.0f, query,
                              qkv_ld, head_stride, dscores_batch, T, probs_head_stride, 1.0f,
                              dkey, qkv_ld, head_stride, NH);
  }
}

}  // namespace scalestudy::cuda
