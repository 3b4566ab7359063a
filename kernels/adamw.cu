#include "adamw.cuh"

#include <cmath>
#include <string>

#include "common.cuh"

namespace scalestudy::cuda {
namespace {

struct AdamWKernelParams {
  float* params;
  const float* grads;
  float* m;
  float* v;
  size_t elems;
  float learning_rate;
  float beta1;
  float beta2;
  float epsilon;
  float weight_decay;
  float bias_correction1;
  float bias_correction2;
};

// The __f*_rn intrinsics (never fused into multiply-adds) and the IEEE-rounded sqrt and
// division reproduce the CPU's fp32 arithmetic step for step.
__global__ void adamw_kernel(AdamWKernelParams p) {
  const float one_minus_beta1 = 1.0f - p.beta1;
  const float one_minus_beta2 = 1.0f - p.beta2;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < p.elems;
       i += size_t{gridDim.x} * blockDim.x) {
    const float grad = p.grads[i];
    const float m_new = __fadd_rn(__fmul_rn(p.beta1, p.m[i]), __fmul_rn(one_minus_beta1, grad));
    const float v_new =
        __fadd_rn(__fmul_rn(p.beta2, p.v[i]), __fmul_rn(__fmul_rn(one_minus_beta2, grad), grad));
    p.m[i] = m_new;
    p.v[i] = v_new;
    const float m_hat = __fdiv_rn(m_new, p.bias_correction1);
    const float v_hat = __fdiv_rn(v_new, p.bias_correction2);
    const float param = p.params[i];
    const float direction = __fadd_rn(__fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), p.epsilon)),
                                      __fmul_rn(p.weight_decay, param));
    p.params[i] = __fsub_rn(param, __fmul_rn(p.learning_rate, direction));
  }
}

}  // namespace

void launch_adamw_update(cudaStream_t stream, float* params, const float* grads, float* m,
                         float* v, size_t elems, const AdamWParams& hyper) {
  SCALESTUDY_CHECK(hyper.step >= 1,
                   "adamw: step is 1-based, got " + std::to_string(hyper.step));
  if (elems == 0) return;
  check_not_null(params, "adamw params");
  check_not_null(grads, "adamw grads");
  check_not_null(m, "adamw m");
  check_not_null(v, "adamw v");
  // In double once on the host: beta^t for large t is where fp32 powers drift.
  const float bias_correction1 =
      static_cast<float>(1.0 - std::pow(double{hyper.beta1}, hyper.step));
  const float bias_correction2 =
      static_cast<float>(1.0 - std::pow(double{hyper.beta2}, hyper.step));
  const AdamWKernelParams p{params,           grads,       m,           v,
                            elems,            hyper.learning_rate,      hyper.beta1,
                            hyper.beta2,      hyper.epsilon,            hyper.weight_decay,
                            bias_correction1, bias_correction2};
  adamw_kernel<<<elementwise_blocks(elems), kElementwiseThreads, 0, stream>>>(p);
  CHECK_LAUNCH();
}

}  // namespace scalestudy::cuda
