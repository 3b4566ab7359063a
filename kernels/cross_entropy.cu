#include "cross_entropy.cuh"

#include <cmath>

#include "common.cuh"

namespace scalestudy::cuda {
namespace {

// A GPT-2 row is 50257 logits: 512 threads give each about a hundred, in three passes
// (max, sum, write) whose re-reads of the row mostly hit L2.
constexpr int kRowThreads = 512;

struct CrossEntropyForwardParams {
  float* losses;
  float* probs;
  const float* logits;
  const int32_t* targets;
  int vocab;
};

struct CrossEntropyBackwardParams {
  float* dlogits;
  const float* probs;
  const int32_t* targets;
  int rows;
  int vocab;
  float loss_scale;
};

// One block per row. Subtracting the row max keeps every exponent <= 0; the sum of the
// exponentials is taken in double, as on the CPU.
__global__ void cross_entropy_forward_kernel(CrossEntropyForwardParams p) {
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  const int row = blockIdx.x;
  const float* x = p.logits + size_t(row) * p.vocab;
  float* prob_row = p.probs + size_t(row) * p.vocab;
  float max_logit = -INFINITY;
  for (int v = threadIdx.x; v < p.vocab; v += blockDim.x) max_logit = fmaxf(max_logit, x[v]);
  max_logit = block_reduce_max(max_logit, shared_max);
  double exp_total = 0.0;
  for (int v = threadIdx.x; v < p.vocab; v += blockDim.x) exp_total += expf(x[v] - max_logit);
  exp_total = block_reduce_sum(exp_total, shared_sum);
  const float inverse_total = static_cast<float>(1.0 / exp_total);
  for (int v = threadIdx.x; v < p.vocab; v += blockDim.x)
    prob_row[v] = __fmul_rn(expf(x[v] - max_logit), inverse_total);
  if (threadIdx.x == 0) {
    const int32_t target = p.targets[row];
    // log-sum-exp rather than -log(prob): a target probability that underflows in fp32
    // still gets a finite, accurate loss.
    p.losses[row] =
        target >= 0 && target < p.vocab
            ? static_cast<float>(log(exp_total) + double{max_logit} - double{x[target]})
            : NAN;
  }
}

// Elementwise over the [rows, vocab] matrix. The target element is updated in two
// roundings, += scale*prob then -= scale, exactly as the CPU does.
__global__ void cross_entropy_backward_kernel(CrossEntropyBackwardParams p) {
  const size_t elems = size_t(p.rows) * p.vocab;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < elems;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t row = i / p.vocab;
    const int v = static_cast<int>(i - row * p.vocab);
    float grad = __fadd_rn(p.dlogits[i], __fmul_rn(p.loss_scale, p.probs[i]));
    if (v == p.targets[row]) grad = __fsub_rn(grad, p.loss_scale);
    p.dlogits[i] = grad;
  }
}

void check_shape(int rows, int vocab) {
  check_positive(rows, "cross-entropy rows");
  check_positive(vocab, "cross-entropy vocab");
}

}  // namespace

void launch_softmax_cross_entropy_forward(cudaStream_t stream, float* losses, float* probs,
                                          const float* logits, const int32_t* targets, int rows,
                                          int vocab) {
  check_shape(rows, vocab);
  check_not_null(losses, "cross-entropy losses");
  check_not_null(probs, "cross-entropy probs");
  check_not_null(logits, "cross-entropy logits");
  check_not_null(targets, "cross-entropy targets");
  const CrossEntropyForwardParams p{losses, probs, logits, targets, vocab};
  cross_entropy_forward_kernel<<<rows, kRowThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

void launch_softmax_cross_entropy_backward(cudaStream_t stream, float* dlogits,
                                           const float* probs, const int32_t* targets, int rows,
                                           int vocab, float loss_scale) {
  check_shape(rows, vocab);
  check_not_null(dlogits, "cross-entropy dlogits");
  check_not_null(probs, "cross-entropy probs");
  check_not_null(targets, "cross-entropy targets");
  const CrossEntropyBackwardParams p{dlogits, probs, targets, rows, vocab, loss_scale};
  const size_t elems = size_t(rows) * vocab;
  cross_entropy_backward_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

}  // namespace scalestudy::cuda
