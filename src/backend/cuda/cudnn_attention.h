#pragma once
// cuDNN's fused scaled-dot-product attention (SDPA), forward and backward, through
// cudnn-frontend's graph API, on the layouts of the op interface (backend/ops.h): Q, K and V
// read in place from the packed qkv[B,T,3C] (head h at h*HS inside each third) through
// strides, out[B,T,C], and the softmax statistics as the flash kernels keep them:
// lse[B,NH,T], fp32, the natural-log log-sum-exp of each query row's scores scaled by
// 1/sqrt(HS). The backward writes dqkv[B,T,3C] over (GradientWrite::overwrite).
//
// libcudnn is opened with dlopen on first use, never linked: the executable starts on a
// machine without cuDNN, where this path is unavailable. A build without cudnn-frontend's
// or cuDNN's headers has no such path (cudnn_attention_loadable says so).
//
// A graph is built, checked and planned once per shape (batch, seq, heads, head size,
// causal, 16-bit type, pass) and kept for the life of the object. Every failure of cuDNN
// ends the job with cuDNN's own message.
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

#include "kernels/op_params.h"
#include "core/precision.h"

namespace scalestudy {

// Whether libcudnn (9 or later) can be opened and this build has the path; otherwise false,
// with the reason in why_not. The first call opens the library; later calls repeat its
// answer.
bool cudnn_attention_loadable(std::string& why_not);

// Whether cuDNN's SDPA takes this shape here: head sizes that are multiples of 8 up to 128
// (cuDNN's condition on Hopper for forward and backward alike), so that every head starts
// 16-byte aligned in qkv, and sequences of more than one token.
bool cudnn_attention_supported(const AttentionShape& shape);

// The tensors of one forward: 16-bit (the precision's type) out and qkv, fp32 lse.
struct CudnnAttentionForward {
  void* out = nullptr;
  float* lse = nullptr;
  const void* qkv = nullptr;
  AttentionShape shape;
};

// The tensors of one backward: dqkv written over, from the forward's out and lse.
struct CudnnAttentionBackward {
  void* dqkv = nullptr;
  const void* dout = nullptr;
  const void* qkv = nullptr;
  const void* out = nullptr;
  const float* lse = nullptr;
  AttentionShape shape;
};

class CudnnAttention {
 public:
  // On `stream`, in bf16 or fp16. Opens libcudnn (ending the job, with the reason, where
  // cudnn_attention_loadable is false) and creates a cuDNN handle on the current device.
  CudnnAttention(Precision precision, cudaStream_t stream);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // The workspace bytes the pass needs for `shape`, building its graph on first use.
  size_t forward_workspace_bytes(const AttentionShape& shape);
  size_t backward_workspace_bytes(const AttentionShape& shape);
  // Enqueue the pass on the stream; workspace holds at least its *_workspace_bytes.
  void forward(const CudnnAttentionForward& args, void* workspace);
  void backward(const CudnnAttentionBackward& args, void* workspace);

 private:
  struct Graphs;
  std::unique_ptr<Graphs> graphs_;
};

}  // namespace scalestudy
