#pragma once
// The GPT-style transformer, written once against the backend's op interface.
//
// The model owns its parameters (one flat buffer, padded to the length the strategy
// asks for) and its activations for one micro-batch. It does not own gradients: during
// backward it asks a GradientSink where each segment's gradients go, and tells it when
// they are final, which is how bucketed strategies learn when to communicate.
#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "model/parameter_layout.h"

namespace scalestudy {

struct GptActivations;  // model/gpt_activations.h

// The row strides of the buffers that the dense layers read, as the backend writes them
// (Ops::dense_input_stride, attention_output_stride, gelu_output_stride): 0 for plain rows,
// or augmented rows, whose dense layer takes its bias gradient from its weight gradient's
// GEMM.
struct DenseInputStrides {
  int ln = 0;         // ln1 and ln2, the LayerNorms' outputs
  int attention = 0;  // atty
  int gelu = 0;       // fch_gelu
};

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // Backward is about to write the gradients of a segment. The sink has them zeroed before
  // the first micro-batch that writes them, and accumulated into after that.
  virtual void begin_segment(int /*segment*/) {}
  // Where backward accumulates the gradients of the tensor (ParameterLayout::tensors) that
  // starts at parameter tensor_begin_elems, in the segment begun last: element i is the
  // gradient of parameter tensor_begin_elems + i. Each tensor's gradients are contiguous;
  // two tensors' need not be.
  virtual float* tensor_gradients(size_t tensor_begin_elems) = 0;
  // The segment's gradients for this micro-batch are complete.
  virtual void segment_done(int segment) = 0;
  // Backward can finish the embeddings in parts: the tied LM head's weight gradient comes
  // last, a range of vocabulary rows at a time, from the last rows down. The sink names the
  // offsets into the segment where it would like a part to end (where its buckets begin),
  // ascending; backward then reports each part that it has finished, from offset_elems to
  // the segment's end, before segment_done.
  virtual std::vector<size_t> segment_cuts(int /*segment*/) const { return {}; }
  virtual void segment_done_from(int /*segment*/, size_t /*offset_elems*/) {}
};

class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;
  // Called before forward reads a segment's parameters (zero2 waits here for them).
  virtual void before_segment_forward(int segment) = 0;
};

class Gpt {
 public:
  // recompute: keep only each block's output and recompute the block's other
  // activations in backward, in buffers that all blocks share (--recompute). An allocation
  // that fails throws OutOfMemoryError, with whatever was allocated released.
  Gpt(Backend& backend, const ModelShape& shape, int micro_batch, int seq, size_t padded_param_elems,
      bool recompute = false);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  // The bytes the constructor allocates on `backend` with these arguments, counted without
  // allocating, by the walk over the buffers that allocates them: the padded parameters
  // (MemoryKind::parameters), and one micro-batch's activations (MemoryKind::activations).
  static size_t parameter_bytes(const Backend& backend, size_t padded_param_elems);
  static size_t activation_bytes(const Backend& backend, const ModelShape& shape, int micro_batch, int seq,
                                 bool recompute);

  const ParameterLayout& layout() const { return layout_; }
  float* params() { return params_; }
  size_t padded_param_elems() const { return padded_param_elems_; }
  int micro_batch() const { return batch_; }
  int seq() const { return seq_; }

  // GPT-2 initialisation from a seed: weights N(0, 0.02), residual projections
  // N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. Identical on every rank.
  void initialize(uint64_t seed);

  // tokens and targets are host arrays of micro_batch*seq. Returns nothing: the loss
  // is read with mean_loss() after forward. A training step passes the loss_scale its
  // backward will take: the classifier then computes the logits' gradient together with
  // the loss (Ops::classifier_forward), and backward must follow with the same scale.
  void forward(const int32_t* host_tokens, const int32_t* host_targets, ForwardHooks* hooks,
               std::optional<float> backward_loss_scale = std::nullopt);
  // Mean cross-entropy of the last forward, in nats.
  double mean_loss();
  // The logits of the last forward ([micro_batch*seq, vocab] in the layout of
  // Ops::allocate_logits), until a training step's forward or backward turns them into
  // their gradient.
  const float* logits() const;
  // loss_scale multiplies d(sum of token losses): 1/(tokens per rank * micro-batches *
  // world) makes the summed gradients over ranks the mean gradient of the global batch.
  void backward(GradientSink& sink, float loss_scale);

 private:
  using Activations = GptActivations;
  // The input of block `layer`: the embedding's output, or the block before's residual3.
  const float* block_input(int layer) const;
  // The block's first LayerNorm, of its input alone.
  void first_layernorm(int layer);
  // One block's forward from its first LayerNorm's output to residual3, the block's output,
  // which its MLP projection writes.
  void forward_block_body(int layer);
  // The end of a block in forward: the LayerNorm of residual3 (the next block's first, or
  // the final one), after that LayerNorm's segment hook.
  void finish_block(int layer, ForwardHooks* hooks);
  // A block's activations again in backward (--recompute): its first LayerNorm and its body,
  // the ops and values of its forward.
  void recompute_block(int layer);
  // A block's dense layer backward, from dout [N, out_channels] to the input gradient dinp
  // [N, C], which has one writer; the weight and bias (offsets into the parameters) get
  // their gradients where the sink says. inp's rows are inp_stride apart (0: plain).
  void dense_backward(size_t weight, size_t bias, float* dinp, const float* dout, const float* inp,
                      int inp_stride, int out_channels, GradientSink& sink);
  // A block's LayerNorm backward from its output's gradient (dln), accumulated into the
  // residual stream's gradient (dresidual).
  void layernorm_backward_into_residual(size_t weight, size_t bias, const float* inp,
                                        const float* mean, const float* rstd, GradientSink& sink);
  // The tied LM head's weight gradient, the end of backward, in the parts the sink asks for.
  void lm_head_weight_backward(GradientSink& sink, float* dwte);
  // Releases every buffer allocated so far (the destructor, and a constructor that failed).
  void release_buffers();
  Ops& ops_;
  DeviceMemory& memory_;
  ParameterLayout layout_;
  int batch_, seq_;
  // The row strides of the dense layers' inputs, as the backend writes them.
  DenseInputStrides strides_;
  size_t padded_param_elems_;
  bool recompute_ = false;
  // The loss_scale of the dlogits that the last forward left in the logits, if it did.
  std::optional<float> dlogits_scale_;
  float* params_ = nullptr;
  Activations* acts_ = nullptr;
  std::vector<void*> owned_;  // the activation buffers, for release
};

}  // namespace scalestudy
