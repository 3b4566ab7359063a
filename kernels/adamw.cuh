#pragma once
// One AdamW step over a contiguous range of fp32 master weights.
#include <cuda_runtime.h>

#include <cstddef>

#include "backend/ops.h"

namespace scalestudy::cuda {

// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr*(m_hat/(sqrt(v_hat)+eps) + wd*p),
// with the bias corrections 1 - beta^step computed once on the host in double, and each
// per-element step rounded as the CPU backend rounds it: the results are bit-identical.
void launch_adamw_update(cudaStream_t stream, float* params, const float* grads, float* m,
                         float* v, size_t elems, const AdamWParams& hyper);

}  // namespace scalestudy::cuda
