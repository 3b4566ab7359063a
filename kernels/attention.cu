#include "attention.cuh"

#include <cmath>
#include <initializer_list>
#include <string>

#include "common.cuh"
#include "gemm.cuh"
#include "precision.cuh"

namespace scalestudy::cuda {
namespace {

// Rows are T long (up to a few thousand): 128 threads give each a handful of elements.
constexpr int kRowThreads = 128;

// T is the storage of qkv, out, probs and their gradients (fp32, bf16 or fp16). Scores
// and their gradient dP are fp32 in all three: in fp32 they live in probs (or the
// backward's scratch) and are overwritten in place; in bf16 and fp16 they live in fp32
// scratch, so the softmax and its backward see the GEMMs' fp32 results rather than 16-bit
// roundings of them (a score of 10 rounded to bf16 is off by up to 0.03, which exp turns
// into 3%; fp16 would also turn scores beyond 65504 into inf).
template <class T>
struct SoftmaxParams {
  const float* scores;  // scaled scores, [B*NH*T, T]
  T* probs;             // may be the same memory as scores (fp32, in place)
  int seq;
  bool causal;
};

template <class T>
struct SoftmaxBackwardParams {
  const float* dprobs;  // d(probs), [B*NH*T, T]
  T* dscores;           // d(scores); may be the same memory as dprobs (fp32, in place)
  const T* probs;
  int seq;
  bool causal;
  float score_scale;
};

// One block per (b, h, t) row. Each thread reads and then overwrites only its own
// elements, with the block reductions in between, so the update can be in place.
// Masked keys become exact zeros, as on the CPU, so that every row is a full
// distribution over T for the PV product and the backward.
template <class T>
__global__ void attention_softmax_kernel(SoftmaxParams<T> p) {
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  const size_t row = blockIdx.x;
  const int t = static_cast<int>(row % p.seq);
  const int key_count = p.causal ? t + 1 : p.seq;
  const float* scores = p.scores + row * p.seq;
  T* probs = p.probs + row * p.seq;
  float max_score = -INFINITY;
  for (int t2 = threadIdx.x; t2 < key_count; t2 += blockDim.x)
    max_score = fmaxf(max_score, scores[t2]);
  max_score = block_reduce_max(max_score, shared_max);
  double exp_total = 0.0;
  for (int t2 = threadIdx.x; t2 < key_count; t2 += blockDim.x)
    exp_total += expf(scores[t2] - max_score);
  exp_total = block_reduce_sum(exp_total, shared_sum);
  const float inverse_total = static_cast<float>(1.0 / exp_total);
  for (int t2 = threadIdx.x; t2 < p.seq; t2 += blockDim.x) {
    probs[t2] = from_float<T>(
        t2 < key_count ? __fmul_rn(expf(scores[t2] - max_score), inverse_total) : 0.0f);
  }
}

// dscore = p * (dp - sum_t3 p[t3] dp[t3]) * scale, the O(T) form of the softmax
// backward, rounded step by step as on the CPU (then once to T). Masked entries become
// exact zeros whatever the GEMM left there.
template <class T>
__global__ void attention_softmax_backward_kernel(SoftmaxBackwardParams<T> p) {
  __shared__ double shared_sum[kWarpSize];
  const size_t row = blockIdx.x;
  const int t = static_cast<int>(row % p.seq);
  const int key_count = p.causal ? t + 1 : p.seq;
  const T* prob_row = p.probs + row * p.seq;
  const float* dprobs = p.dprobs + row * p.seq;
  T* dscores = p.dscores + row * p.seq;
  double weighted_total = 0.0;
  for (int t2 = threadIdx.x; t2 < key_count; t2 += blockDim.x)
    weighted_total += static_cast<double>(to_float(prob_row[t2])) * dprobs[t2];
  const float dprob_mean = static_cast<float>(block_reduce_sum(weighted_total, shared_sum));
  for (int t2 = threadIdx.x; t2 < p.seq; t2 += blockDim.x) {
    dscores[t2] = from_float<T>(
        t2 < key_count ? __fmul_rn(__fmul_rn(to_float(prob_row[t2]),
                                             __fsub_rn(dprobs[t2], dprob_mean)),
                                   p.score_scale)
                       : 0.0f);
  }
}

// The sizes and strides of the GEMMs' views below, of a shape whose rows fit the grid.
struct AttentionStrides {
  int head_size;
  int seq;       // T
  int channels;  // C
  int heads;     // NH
  int qkv_ld;    // 3C
  long long head_stride;        // hs: from one head's columns to the next
  long long probs_head_stride;  // T*T: from one head's probabilities to the next
};

AttentionStrides strides_of(const AttentionShape& shape) {
  const int head_size = attention_head_size(shape);
  SCALESTUDY_CHECK(static_cast<long long>(shape.batch) * shape.heads * shape.seq < (1ll << 31),
                   "attention: batch*heads*seq rows must fit in a grid dimension");
  SCALESTUDY_CHECK(3ll * shape.channels < (1ll << 31), "attention: 3*channels must fit in an int");
  return {head_size,     shape.seq, shape.channels, shape.heads, 3 * shape.channels, head_size,
          static_cast<long long>(shape.seq) * shape.seq};
}

// The strides of a launch on `shape`, once its operands (none null) and the handle's
// stream have passed their checks.
AttentionStrides checked_strides(cublasHandle_t handle, cudaStream_t stream,
                                 const AttentionShape& shape,
                                 std::initializer_list<NamedOperand> operands) {
  const AttentionStrides strides = strides_of(shape);
  check_not_null(operands);
  check_handle_stream(handle, stream);
  return strides;
}

// dst^T[hs, T] += a^T[hs, T2] · op_b(b) over the heads (beta = 1): a head of dqkv
// accumulates a head of `a` times its [T, T2] matrix in b (probabilities or dS, in T).
template <class T>
void accumulate_heads(cublasHandle_t handle, const AttentionStrides& s, T* dst, GemmMatrix a,
                      cublasOperation_t op_b, const T* b) {
  gemm_strided_batched(handle, {GemmTypesOf<T>::same, CUBLAS_OP_N, op_b, s.head_size, s.seq, s.seq,
                                1.0f, a, {b, s.seq, s.probs_head_stride}, 1.0f,
                                {dst, s.qkv_ld, s.head_stride}, s.heads});
}

float score_scale_of(int head_size) {
  return 1.0f / std::sqrt(static_cast<float>(head_size));
}

size_t probs_elems_of(const AttentionShape& shape) {
  return size_t(shape.batch) * shape.heads * shape.seq * shape.seq;
}

// Q, K, V, P, dY and dS are in T, the scores and dP always in fp32 (GemmTypesOf).
// Per batch b, one strided-batched GEMM over the NH heads. Head h of Q, K or V is the
// row-major [T, hs] matrix at qkv + b*T*3C + part*C + h*hs with row stride 3C, so the
// heads are hs apart and no permuted copy is needed. In cuBLAS's column-major view
// (gemm.cuh), each such head is its transpose [hs, T] with ld 3C.
//   scores:  S^T[T2, T] = K[T2, hs] · Q^T[hs, T]   (K: op T, Q: op N), alpha = 1/sqrt(hs),
//            written row-major [T, T2] (ld T), heads T*T apart, into `scores` (fp32).
//   outputs: Y^T[hs, T] = V^T[hs, T2] · P^T[T2, T]  (V: op N, P: op N), written into
//            out row-major [T, C] at column h*hs (ld C), heads hs apart.
template <class T>
void attention_forward(cublasHandle_t handle, cudaStream_t stream, T* out, T* probs,
                       const T* qkv, const AttentionShape& shape, float* scores) {
  const auto [head_size, T_, C, NH, qkv_ld, head_stride, probs_head_stride] =
      checked_strides(handle, stream, shape,
                      {{out, "attention out"}, {probs, "attention probs"},
                       {qkv, "attention qkv"}, {scores, "attention scores"}});
  for (int b = 0; b < shape.batch; ++b) {
    const T* query = qkv + size_t(b) * T_ * qkv_ld;
    const T* key = query + C;
    float* scores_batch = scores + size_t(b) * NH * probs_head_stride;
    gemm_strided_batched(handle, {GemmTypesOf<T>::to_fp32, CUBLAS_OP_T, CUBLAS_OP_N, T_, T_,
                                  head_size, score_scale_of(head_size), {key, qkv_ld, head_stride},
                                  {query, qkv_ld, head_stride}, 0.0f,
                                  {scores_batch, T_, probs_head_stride}, NH});
  }
  const SoftmaxParams<T> softmax{scores, probs, T_, shape.causal};
  attention_softmax_kernel<T><<<shape.batch * NH * T_, kRowThreads, 0, stream>>>(softmax);
  CHECK_LAUNCH();
  for (int b = 0; b < shape.batch; ++b) {
    const T* value = qkv + size_t(b) * T_ * qkv_ld + 2 * C;
    const T* probs_batch = probs + size_t(b) * NH * probs_head_stride;
    T* out_batch = out + size_t(b) * T_ * C;
    gemm_strided_batched(handle, {GemmTypesOf<T>::same, CUBLAS_OP_N, CUBLAS_OP_N, head_size, T_, T_,
                                  1.0f, {value, qkv_ld, head_stride},
                                  {probs_batch, T_, probs_head_stride}, 0.0f,
                                  {out_batch, C, head_stride}, NH});
  }
}

// Same views as the forward; all four GEMMs into dqkv run with beta = 1 (accumulate).
//   dP^T[T2, T] = V[T2, hs] · dY^T[hs, T]      (V: op T, dY: op N, dY ld C)  -> dprobs
//   dV^T[hs, T2] += dY^T[hs, T] · P[T, T2]     (dY: op N, P: op T)
//   (softmax backward turns dP into dS)
//   dQ^T[hs, T] += K^T[hs, T2] · dS^T[T2, T]   (K: op N, dS: op N)
//   dK^T[hs, T2] += Q^T[hs, T] · dS[T, T2]     (Q: op N, dS: op T)
template <class T>
void attention_backward(cublasHandle_t handle, cudaStream_t stream,
                        const AttentionBackwardArgs<T>& args, float* dprobs, T* dscores) {
  T* const dqkv = args.dqkv;
  const T* const dout = args.dout;
  const T* const qkv = args.qkv;
  const T* const probs = args.state;
  const AttentionShape& shape = args.shape;
  SCALESTUDY_CHECK(args.dqkv_write == GradientWrite::accumulate,
                   "attention backward: the cuBLAS path accumulates into dqkv");
  const AttentionStrides strides =
      checked_strides(handle, stream, shape,
                      {{dqkv, "attention dqkv"}, {dout, "attention dout"},
                       {qkv, "attention qkv"}, {probs, "attention probs"}});
  const auto [head_size, T_, C, NH, qkv_ld, head_stride, probs_head_stride] = strides;
  for (int b = 0; b < shape.batch; ++b) {
    const T* value = qkv + size_t(b) * T_ * qkv_ld + 2 * C;
    const T* dout_batch = dout + size_t(b) * T_ * C;
    float* dprobs_batch = dprobs + size_t(b) * NH * probs_head_stride;
    gemm_strided_batched(handle, {GemmTypesOf<T>::to_fp32, CUBLAS_OP_T, CUBLAS_OP_N, T_, T_,
                                  head_size, 1.0f, {value, qkv_ld, head_stride},
                                  {dout_batch, C, head_stride}, 0.0f,
                                  {dprobs_batch, T_, probs_head_stride}, NH});
    accumulate_heads(handle, strides, dqkv + size_t(b) * T_ * qkv_ld + 2 * C,
                     {dout_batch, C, head_stride}, CUBLAS_OP_T,
                     probs + size_t(b) * NH * probs_head_stride);
  }
  const SoftmaxBackwardParams<T> softmax{dprobs, dscores, probs, T_, shape.causal,
                                         score_scale_of(head_size)};
  attention_softmax_backward_kernel<T><<<shape.batch * NH * T_, kRowThreads, 0, stream>>>(softmax);
  CHECK_LAUNCH();
  for (int b = 0; b < shape.batch; ++b) {
    const T* query = qkv + size_t(b) * T_ * qkv_ld;
    const T* key = query + C;
    const T* dscores_batch = dscores + size_t(b) * NH * probs_head_stride;
    T* dquery = dqkv + size_t(b) * T_ * qkv_ld;
    accumulate_heads(handle, strides, dquery, {key, qkv_ld, head_stride}, CUBLAS_OP_N,
                     dscores_batch);
    accumulate_heads(handle, strides, dquery + C, {query, qkv_ld, head_stride}, CUBLAS_OP_T,
                     dscores_batch);
  }
}

// The 16-bit backward's scratch: fp32 dP, then dS in T (bf16 or fp16, 2 bytes) from a
// 16-byte boundary.
size_t dscores_offset_elems_16bit(const AttentionShape& shape) {
  return (probs_elems_of(shape) + 3) / 4 * 4;
}

size_t backward_scratch_elems_16bit(const AttentionShape& shape) {
  return dscores_offset_elems_16bit(shape) + (probs_elems_of(shape) + 1) / 2;
}

}  // namespace

void launch_attention_forward(cublasHandle_t handle, cudaStream_t stream, float* out,
                              float* probs, const float* qkv, const AttentionShape& shape) {
  attention_forward(handle, stream, out, probs, qkv, shape, probs);
}

size_t attention_forward_scratch_elems_16bit(const AttentionShape& shape) {
  return probs_elems_of(shape);
}

template <class T>
void launch_attention_forward(cublasHandle_t handle, cudaStream_t stream, T* out, T* probs,
                              const T* qkv, const AttentionShape& shape, Scratch scratch) {
  check_not_null(scratch.data, "attention scratch");
  SCALESTUDY_CHECK(scratch.elems >= probs_elems_of(shape), "attention forward: scratch too small");
  attention_forward(handle, stream, out, probs, qkv, shape, scratch.data);
}

size_t attention_backward_scratch_elems(const AttentionShape& shape) {
  return probs_elems_of(shape);
}

void launch_attention_backward(cublasHandle_t handle, cudaStream_t stream,
                               const AttentionBackwardArgs<float>& args, Scratch scratch) {
  check_not_null(scratch.data, "attention scratch");
  SCALESTUDY_CHECK(scratch.elems >= attention_backward_scratch_elems(args.shape),
                   "attention backward: scratch too small");
  attention_backward(handle, stream, args, scratch.data, scratch.data);
}

size_t attention_backward_scratch_elems_16bit(const AttentionShape& shape) {
  return backward_scratch_elems_16bit(shape);
}

template <class T>
void launch_attention_backward(cublasHandle_t handle, cudaStream_t stream,
                               const AttentionBackwardArgs<T>& args, Scratch scratch) {
  static_assert(sizeof(T) == 2, "the scratch layout assumes 2-byte storage");
  check_not_null(scratch.data, "attention scratch");
  SCALESTUDY_CHECK(scratch.elems >= backward_scratch_elems_16bit(args.shape),
                   "attention backward: scratch too small");
  T* dscores = reinterpret_cast<T*>(scratch.data + dscores_offset_elems_16bit(args.shape));
  attention_backward(handle, stream, args, scratch.data, dscores);
}

#define SCALESTUDY_ATTENTION_16BIT_INSTANCES(T)                                                   \
  template void launch_attention_forward(cublasHandle_t, cudaStream_t, T*, T*, const T*,          \
                                         const AttentionShape&, Scratch);                         \
  template void launch_attention_backward(cublasHandle_t, cudaStream_t,                           \
                                          const AttentionBackwardArgs<T>&, Scratch);
SCALESTUDY_FOR_EACH_16BIT_STORAGE(SCALESTUDY_ATTENTION_16BIT_INSTANCES)
#undef SCALESTUDY_ATTENTION_16BIT_INSTANCES

}  // namespace scalestudy::cuda
