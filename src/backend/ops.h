#pragma once
// The math of the model: the op interface that its forward and backward are written
// against, once, for every backend. Pointers are the backend's own memory (host on cpu,
// device on cuda), from its DeviceMemory (backend/device_memory.h).
//
// Conventions that every implementation keeps:
// - Row-major tensors. N is the number of rows (tokens: B*T), C the channels.
// - Backward ops ACCUMULATE (+=) into the parameter gradients, so a tensor that feeds
//   two consumers (the tied embedding) collects both contributions; callers zero those
//   buffers before use. The gradient of an op's input is accumulated or written over,
//   as the caller's GradientWrite says: the residual stream collects the branches'
//   contributions, while a buffer with one writer is simply written, with no zero fill
//   before it and no read of its old contents. The cross-entropy's dlogits is always
//   written, and says so.
// - Scratch outputs of a forward op (LayerNorm mean/rstd, attention probabilities) are
//   what its backward takes back.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/check.h"
#include "core/model_shape.h"
#include "kernels/op_params.h"

namespace scalestudy {

class Ops {
 public:
  virtual ~Ops() = default;
  // ---- embedding ------------------------------------------------------------------
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
  virtual void embedding_forward(const EmbeddingForwardArgs<float>& args) = 0;
  virtual void embedding_backward(const EmbeddingBackwardArgs<float>& args) = 0;

  // ---- LayerNorm (eps 1e-5), per row of C -----------------------------------------
  virtual void layernorm_forward(const LayerNormForwardArgs<float>& args) = 0;
  virtual void layernorm_backward(const LayerNormBackwardArgs<float>& args) = 0;

  // ---- dense layer: out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] -------------
  // bias may be null (the tied LM head has none); then dbias is null too. inp_stride: 0
  // for plain rows, or inp's augmented rows (kernels/op_params.h). A forward's residual,
  // where not null, is added to out: the residual stream's add after a projection.
  virtual void matmul_forward(const MatmulForwardArgs<float>& args) = 0;
  virtual void matmul_backward(const MatmulBackwardArgs<float>& args) = 0;
  // The row stride of the model's LayerNorm outputs, which only dense layers read: 0 for
  // plain rows, or augmented rows of this stride, whose dense layers' backward then takes
  // the bias gradient from the weight gradient's GEMM (kernels/op_params.h).
  virtual int dense_input_stride(int channels) const {
    (void)channels;
    return 0;
  }
  // Likewise for the two other inputs of dense layers, where the backend's writer of them
  // writes augmented rows: the attention's out (attention_forward, shape.out_stride) and the
  // GELU's out (dense_gelu_forward's out_stride, of `channels`).
  virtual int attention_output_stride(const AttentionShape& shape) const {
    (void)shape;
    return 0;
  }
  virtual int gelu_output_stride(int channels) const {
    (void)channels;
    return 0;
  }

  // ---- a dense layer and a GELU together (GPT-2's MLP) --------------------------------
  // A backend may fold the GELU into the GEMMs on either side of it (the CUDA backend in
  // bf16: cuBLASLt epilogues), so that neither the GELU's output nor its gradient
  // makes a pass over memory of its own; the defaults run the plain ops one after another.
  //
  // pre[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] and out[N,OC] = gelu(pre): both are
  // written, pre for the backward and out for the next layer. bias may be null.
  // A null pre is not kept: the GELU then runs in place on out.
  virtual void dense_gelu_forward(const DenseGeluForwardArgs<float>& args) {
    SCALESTUDY_CHECK(args.out_stride == 0, "dense_gelu_forward: the plain ops write plain rows");
    float* pre = args.pre != nullptr ? args.pre : args.out;
    matmul_forward({.out = pre, .inp = args.inp, .weight = args.weight, .bias = args.bias,
                    .rows = args.rows, .in_channels = args.in_channels,
                    .out_channels = args.out_channels, .inp_stride = args.inp_stride});
    gelu_forward(args.out, pre, static_cast<size_t>(args.rows) * args.out_channels);
  }
  // The backward of a dense layer out[N,OC] = act[N,IC] @ weight[OC,IC]^T + bias[OC] whose
  // input is act = gelu(pre), carried on through the GELU:
  //   dpre[N,IC] = gelu'(pre) * (dout @ weight)   written, as GradientWrite::overwrite
  //   dweight   += dout^T @ act                    accumulated
  //   dbias     += column sums of dout             accumulated (dbias may be null)
  // dpre has one writer in the model, so it is never accumulated into, and its old contents
  // are never read. The gradient of act is not returned: dact_scratch [N,IC] holds it where
  // a backend needs it in memory (the default does), and is unspecified afterwards.
  virtual void dense_backward_through_gelu(const DenseGeluBackwardArgs<float>& args) {
    matmul_backward({.dinp = args.dact_scratch, .dweight = args.dweight, .dbias = args.dbias,
                     .dout = args.dout, .inp = args.act, .weight = args.weight, .rows = args.rows,
                     .in_channels = args.in_channels, .out_channels = args.out_channels,
                     .dinp_write = GradientWrite::overwrite, .inp_stride = args.act_stride});
    gelu_backward(args.dpre, args.pre, args.dact_scratch,
                  static_cast<size_t>(args.rows) * args.in_channels, GradientWrite::overwrite);
  }

  // ---- multi-head attention -------------------------------------------------------
  // qkv[B,T,3C] holds Q, K, V side by side; out[B,T,C]. Scale 1/sqrt(head size); with
  // causal, key t2 > query t is masked. `state` is what the forward keeps for the
  // backward: the probabilities [B,NH,T,T] in an activation buffer (every backend), or
  // whatever allocate_attention_state chose. The backward reads the
  // forward's out as well, and writes the gradients of Q, K and V into dqkv as
  // dqkv_write says.
  virtual void attention_forward(float* out, float* state, const float* qkv,
                                 const AttentionShape& shape) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* state,
                                  const AttentionShape& shape, GradientWrite dqkv_write) = 0;
  // The attention state of the model's layers, a buffer that DeviceMemory::release
  // frees: the probabilities on the CPU; a backend with fused attention keeps less (the
  // CUDA backend in bf16/fp16: the rows' log-sum-exp, [B,NH,T] fp32).
  virtual float* allocate_attention_state(const AttentionShape& shape) = 0;
  // The bytes allocate_attention_state(shape) takes, without allocating.
  virtual size_t attention_state_bytes(const AttentionShape& shape) const = 0;

  // ---- tanh-approximated GELU, elementwise ---------------------------------------
  virtual void gelu_forward(float* out, const float* inp, size_t elems) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems,
                             GradientWrite dinp_write) = 0;

  // ---- dst += src, elementwise ---------------------------------------------------
  // zero2 adds each later micro-batch's reduced shard with it.
  virtual void accumulate(float* dst, const float* src, size_t elems) = 0;

  // ---- softmax cross-entropy over rows of V logits ---------------------------------
  // losses[N] = logsumexp(logits[n,:]) - logits[n, targets[n]]. row_stats[2N] (from
  // allocate_statistics) keeps, per row, the max logit and 1 / sum(exp(logit - max)): the
  // softmax that the backward recomputes, so no [N,V] probabilities are stored.
  virtual void softmax_cross_entropy_forward(float* losses, float* row_stats,
                                             const float* logits, const int32_t* targets,
                                             int rows, int vocab) = 0;
  // dlogits[n,:] = loss_scale * (softmax(logits[n,:]) - onehot(targets[n])), for a loss that
  // is loss_scale * sum_n losses[n] (loss_scale = 1/(rows*micro_batches) for the mean).
  // The one backward op that WRITES rather than accumulates: dlogits starts the chain and
  // has no other contributor, and it may be logits itself (in place).
  virtual void softmax_cross_entropy_backward(float* dlogits, const float* logits,
                                              const float* row_stats, const int32_t* targets,
                                              int rows, int vocab, float loss_scale) = 0;

  // ---- the classifier: the tied LM head and the cross-entropy together ---------------
  // logits[N,V] = inp[N,C] @ weight[V,C]^T (no bias), then the cross-entropy forward. The
  // logits buffer comes from allocate_logits, whose row layout is the backend's: the CUDA
  // backend pads 16-bit rows to a multiple of 8 elements, where cuBLAS's fast kernels
  // need them, so nothing is copied to or from padded rows in the step. The CPU's are the
  // plain [N,V]. DeviceMemory::release frees them.
  virtual float* allocate_logits(int rows, int vocab) = 0;
  // The bytes allocate_logits(rows, vocab) takes, without allocating (rows as a size, so
  // that the preflight can size a micro-batch too large for the ops' int rows).
  virtual size_t logits_bytes(size_t rows, int vocab) const = 0;
  // Without losses it computes the logits alone (inference).
  // With dlogits_scale, a training step's loss_scale, the cross-entropy's backward runs
  // here too: the logits are left holding dlogits, and the step's backward starts at
  // classifier_backward_from_dlogits. The CUDA backend then reads the logits once for the
  // loss and their gradient together.
  virtual void classifier_forward(const ClassifierForwardArgs<float>& args) {
    const auto& [losses, row_stats, logits, inp, weight, targets, rows, channels, vocab,
                 dlogits_scale] = args;
    matmul_forward({.out = logits, .inp = inp, .weight = weight, .rows = rows,
                    .in_channels = channels, .out_channels = vocab});
    if (losses == nullptr) return;
    softmax_cross_entropy_forward(losses, row_stats, logits, targets, rows, vocab);
    if (dlogits_scale)
      softmax_cross_entropy_backward(logits, logits, row_stats, targets, rows, vocab,
                                     *dlogits_scale);
  }
  // The LM head's backward, in two parts that the model runs apart: the weight gradient
  // last in backward, in pieces that a strategy communicates while the next is computed.
  // From the dlogits that classifier_forward left in the logits buffer:
  //   classifier_backward_from_dlogits: dinp (+)= dlogits @ weight as dinp_write says;
  //   classifier_weight_backward: dweight's rows [vocab_begin, vocab_end) += their columns
  //   of dlogits^T @ inp. dweight points at row 0, vocab_begin is a multiple of 8, and a
  //   row's gradient does not depend on the range it was computed in.
  virtual void classifier_backward_from_dlogits(const ClassifierInputGradientArgs<float>& args) = 0;
  virtual void classifier_weight_backward(const ClassifierWeightGradientArgs<float>& args) = 0;
  // After a classifier_forward without dlogits_scale: overwrites logits with dlogits, then
  // runs classifier_backward_from_dlogits. The logits of that forward are gone afterwards.
  virtual void classifier_backward(const ClassifierBackwardArgs<float>& args) {
    softmax_cross_entropy_backward(args.logits, args.logits, args.row_stats, args.targets,
                                   args.rows, args.vocab, args.loss_scale);
    classifier_backward_from_dlogits(input_gradient_of(args));
  }
  virtual double sum(const float* x, size_t elems) = 0;

  // ---- optimizer ------------------------------------------------------------------
  virtual double sum_of_squares(const float* x, size_t elems) = 0;
  virtual void scale(float* x, size_t elems, float factor) = 0;
  // One AdamW step over a contiguous range. params are the fp32 master weights.
  virtual void adamw_update(float* params, const float* grads, float* m, float* v,
                            size_t elems, const AdamWParams& hyper) = 0;
  // One AdamW step over a contiguous range cut into pieces (a model's tensors), each with
  // its own weight decay. Returns true where the backend has also refreshed its
  // lower-precision copy of the updated range in the same pass, so that the caller skips
  // parameters_changed for it; false leaves that to the caller. The default runs
  // adamw_update piece by piece and returns false.
  virtual bool adamw_update_pieces(float* params, const float* grads, float* m, float* v,
                                   const std::vector<AdamWPiece>& pieces,
                                   const AdamWParams& hyper) {
    for (const AdamWPiece& piece : pieces) {
      AdamWParams piece_hyper = hyper;
      piece_hyper.weight_decay = piece.weight_decay;
      adamw_update(params + piece.begin_elems, grads + piece.begin_elems, m + piece.begin_elems,
                   v + piece.begin_elems, piece.end_elems - piece.begin_elems, piece_hyper);
    }
    return false;
  }
  // The bytes a backend keeps for a list of pieces that adamw_update_pieces was given (the
  // CUDA backend uploads each distinct list once, under MemoryKind::optimizer); 0 here.
  virtual size_t adamw_pieces_bytes(const std::vector<AdamWPiece>& pieces) const {
    (void)pieces;
    return 0;
  }

  // The master parameters [params + begin_elems, params + end_elems) changed (an optimizer
  // update, a parameter all-gather, a copy from the host): backends that compute from a
  // lower-precision copy of the parameters refresh that range of it, in stream order.
  // `params` lies in the MemoryKind::parameters allocation. A no-op for fp32 backends.
  virtual void parameters_changed(const float* params, size_t begin_elems,
                                  size_t end_elems) = 0;
  // The lower-precision copy that this backend's ops read in place of the parameters at
  // `params` (in the MemoryKind::parameters allocation), as 16-bit words at the same
  // element offsets; nullptr where the ops read the fp32 parameters themselves. A
  // strategy may write the copy itself (zero2 gathers it from the other ranks), and then
  // owes no parameters_changed for what it wrote.
  virtual uint16_t* compute_copy_of(float* params) {
    (void)params;
    return nullptr;
  }

  // ---- scratch --------------------------------------------------------------------
  // The most scratch that the ops of a GPT model of `shape` hold at micro-batches of
  // batch x seq tokens (batch * seq within int), counted as MemoryKind::other: the memory
  // preflight's term for the backend's own buffers. 0 where the ops hold none (the CPU's
  // per-row scratch lives and dies inside one op).
  virtual size_t model_scratch_bytes(const ModelShape& shape, int batch, int seq) const {
    (void)shape, (void)batch, (void)seq;
    return 0;
  }
};

}  // namespace scalestudy
