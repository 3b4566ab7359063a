#pragma once
// The model's forward for inference: the logits of a batch of sequences, keeping no state
// for a backward.
//
// It holds the parameters and one layer's working set, which every layer reuses: the
// residual stream (two buffers, read and written in turn), one LayerNorm output that the
// attention's output also uses, Q/K/V, the MLP's hidden layer and one layer's attention
// state. No per-layer activations, no gradients, no optimizer state.
// Only the final LayerNorm's output is read by the LM head, so the rest of the working
// set lies inside the logits buffer, which the head writes last: a batch needs the larger
// of the two, not their sum (for BERT's vocabulary, the logits alone). The logits are
// therefore valid until the next forward.
// Its ops are the training forward's (Gpt::forward), so it runs the same kernels: flash
// attention and the GEMM epilogues where the backend has them. Two differences: the MLP's
// pre-GELU values are not kept (DenseGeluForwardArgs::pre is null), and the classifier
// computes the logits alone (no targets, no loss). Neither changes a value's arithmetic,
// so the logits are the training forward's bit for bit on the CPU and in fp32 and fp16 on
// cuda; in bf16 cuBLASLt may choose another algorithm for the GELU epilogue without its
// auxiliary output, and a hidden value may round the other way (tests/gpu/test_gpu_inference.cpp).
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "model/parameter_layout.h"

namespace scalestudy {

// What one GptInference of a shape allocates: its buffers in the backend's elements, and
// the bytes they take on a backend (its storage precision decides).
struct InferenceMemory {
  size_t parameter_elems = 0;   // MemoryKind::parameters
  size_t working_elems = 0;     // activations: the working set that lies inside the logits
  size_t layernorm_elems = 0;   // activations: the LayerNorm output, beside the logits
  size_t statistics_elems = 0;  // fp32 LayerNorm mean and rstd
  size_t token_elems = 0;       // int32
  AttentionShape attention;     // one layer's attention state
  int logits_rows = 0, vocab = 0;
  // The rows of the logits allocation on `backend`: the batch's, or more where the working
  // set is larger than the batch's logits (a small vocabulary).
  size_t logits_allocation_rows(const Backend& backend) const;
  // The bytes on `backend`: every buffer above as the backend stores it.
  size_t bytes(const Backend& backend) const;
};
InferenceMemory inference_memory(const ModelShape& shape, int batch, int seq);

class GptInference {
 public:
  GptInference(Backend& backend, const ModelShape& shape, int batch, int seq);
  ~GptInference();
  GptInference(const GptInference&) = delete;
  GptInference& operator=(const GptInference&) = delete;

  const ParameterLayout& layout() const { return layout_; }
  // The fp32 parameters, layout().param_elems of them; after writing them, call
  // Ops::parameters_changed (initialize does).
  float* params() { return params_; }
  void initialize(uint64_t seed);

  // tokens: a host array of batch*seq. Queues the forward; the logits are ready in stream
  // order.
  void forward(const int32_t* host_tokens);
  // [batch*seq, vocab] in the layout of Ops::allocate_logits.
  const float* logits() const { return logits_; }

 private:
  Ops& ops_;
  DeviceMemory& memory_;
  ParameterLayout layout_;
  int batch_, seq_;
  float* params_ = nullptr;
  int32_t* tokens_ = nullptr;
  float* logits_ = nullptr;  // the allocation that also holds the working set below
  float* residual_[2] = {nullptr, nullptr};
  float *qkv_ = nullptr, *hidden_ = nullptr;
  float *ln_ = nullptr, *mean_ = nullptr, *rstd_ = nullptr, *attention_state_ = nullptr;
};

}  // namespace scalestudy
