#pragma once
// The buffers of one micro-batch that Gpt keeps (model/gpt.h), and the one walk over them
// that both allocates them (Gpt's constructor) and counts their bytes without allocating
// (Gpt::activation_bytes, for the memory preflight), so that the count cannot drift from
// what is allocated. Included by the model's own sources only.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "core/model_shape.h"
#include "kernels/op_params.h"
#include "model/gpt.h"

namespace scalestudy {

// Saved activations of one micro-batch, per layer where backward needs them, plus the
// scratch gradients that backward reuses from layer to layer. With recomputation every
// layer's entry points at the same buffers except residual3, its output and the next
// layer's input, which backward recomputes the rest from.
struct GptActivations {
  struct Layer {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att_probs, *residual2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *residual3;
  };
  int32_t *tokens = nullptr, *targets = nullptr;
  float* encoded = nullptr;
  std::vector<Layer> layers;
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr;
  // logits turn into their own gradient: in a training step's forward, or in backward.
  float *logits = nullptr, *row_stats = nullptr, *losses = nullptr;
  // Scratch: the gradients in backward.
  float *dresidual = nullptr, *dln = nullptr, *dqkv = nullptr, *datty = nullptr, *dfch = nullptr,
        *dfch_gelu = nullptr;
};

// Where each buffer comes from, by the backend call that allocates it.
class ActivationSource {
 public:
  virtual ~ActivationSource() = default;
  virtual float* floats(size_t elems) = 0;  // allocate_floats(elems, MemoryKind::activations)
  // allocate_statistics: row statistics and losses stay fp32 whatever the activation
  // precision.
  virtual float* statistics(size_t elems) = 0;
  virtual int32_t* ints(size_t elems) = 0;  // allocate_ints(elems, MemoryKind::activations)
  virtual float* attention_state(const AttentionShape& shape) = 0;
  virtual float* logits(size_t rows, int vocab) = 0;
};

// The row strides `ops` writes the dense layers' inputs in, for the model at this
// micro-batch (the attention's depends on the shape, through the kernels that run it).
DenseInputStrides dense_input_strides(const Ops& ops, const ModelShape& model, int micro_batch, int seq);

struct ActivationShape {
  ModelShape model;
  int micro_batch = 0;
  int seq = 0;
  bool recompute = false;  // --recompute: one set of block buffers for every layer
  DenseInputStrides strides;
};

// Takes every buffer of `shape` from `source` into `activations`.
void lay_out_activations(const ActivationShape& shape, ActivationSource& source, GptActivations& activations);

}  // namespace scalestudy
