#pragma once
// The parameters that the ops of every backend and the CUDA kernels under them share:
// the constants of their arithmetic, how a backward op writes its input's gradient, the
// attention's shape, AdamW's hyper-parameters, and the arguments of the ops that take many.
//
// An op's arguments are a struct of its tensors and sizes, templated on T, the storage of
// the activations and of the parameters the op reads: float in the op interface (whose
// float* may be handles of 16-bit storage, see DeviceMemory) and in the fp32 kernels,
// __nv_bfloat16 or __half in the 16-bit ones. Row statistics, losses and parameter
// gradients are fp32 whatever T is. Call sites name the fields:
//   ops.layernorm_forward({.out = ln, .mean = mean, .rstd = rstd, .inp = x,
//                          .weight = w, .bias = b, .rows = N, .channels = C});
#include <cstddef>
#include <cstdint>
#include <optional>

namespace scalestudy {

// The constants of the ops' arithmetic, the same on every backend: LayerNorm's epsilon
// (added to the variance), and sqrt(2/pi) and the cubic coefficient of the tanh
// approximation of GELU that GPT-2 was trained with.
inline constexpr double kLayerNormEpsilon = 1e-5;
inline constexpr float kGeluScale = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;

// How a backward op writes the gradient of its input. accumulate: dinp += the
// gradient. overwrite: dinp = the gradient, and dinp's old contents are never read (they
// may be anything, NaN included); on every backend the result equals accumulating into
// a zeroed buffer.
enum class GradientWrite { accumulate, overwrite };

// ---- augmented rows: a dense layer's input as [x, 1] -----------------------------------
// The op that writes a dense layer's input (a LayerNorm, the attention, the GELU) may write
// its rows `stride` elements apart, stride >= channels + kAugmentedColumns, each row
// followed by the columns (1, 0, ..., 0). The dense layer reads x with that row stride, and
// its weight gradient over [x, 1], one GEMM, holds the bias gradient as its column
// `channels`: the backward reads dout once, not once more for the bias's column sums. A
// stride of 0 means plain rows, `channels` apart; which layout a backend's model runs is
// the answer of Ops::dense_input_stride and the two after it.
inline constexpr int kAugmentedColumns = 8;

// The elements from one row to the next: `stride`, or `channels` where stride is 0.
inline int row_stride(int stride, int channels) { return stride != 0 ? stride : channels; }
// Aborts, naming `what`, where `stride` lays rows of `channels` out neither plain (0) nor
// augmented.
void check_row_stride(int stride, int channels, const char* what);

struct AttentionShape {
  int batch = 0;      // B
  int seq = 0;        // T
  int channels = 0;   // C
  int heads = 0;      // NH; head size is C / NH
  bool causal = true; // false: bidirectional (BERT-style)
  int out_stride = 0; // out's rows [B,T,C]: plain (0) or augmented (above); dout's plain
};

// The backward of multi-head attention: dqkv (+)= the gradients of Q, K and V, as
// dqkv_write says, from the forward's qkv, out and state (State: the probabilities' T, or
// the fused kernels' fp32 log-sum-exp).
template <class T, class State = T>
struct AttentionBackwardArgs {
  T* dqkv = nullptr;
  const T *dout = nullptr, *qkv = nullptr, *out = nullptr;
  const State* state = nullptr;
  AttentionShape shape;
  GradientWrite dqkv_write = GradientWrite::accumulate;
};

// The head size C / NH of a shape whose sizes are positive and whose channels are a
// multiple of its heads; aborts, naming the size, otherwise.
int attention_head_size(const AttentionShape& shape);

// The elements of the attention probabilities [B,NH,T,T].
inline size_t attention_probs_elems(const AttentionShape& shape) {
  return static_cast<size_t>(shape.batch) * shape.heads * shape.seq * shape.seq;
}

struct AdamWParams {
  float learning_rate = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float epsilon = 1e-8f;
  float weight_decay = 0.0f;  // decoupled; 0 for tensors that are not decayed
  int step = 1;               // 1-based, for bias correction
};

// The fp32 tensors of an AdamW step over a range: the master weights (params), m and v
// updated in place from grads, each pointing at the range's first element.
struct AdamWTensors {
  float* params = nullptr;
  const float* grads = nullptr;
  float *m = nullptr, *v = nullptr;
};

// A piece [begin_elems, end_elems) of a range that adamw_update_pieces updates, offsets
// from the range's start, with the weight decay of its tensor (0 for one not decayed).
struct AdamWPiece {
  size_t begin_elems = 0;
  size_t end_elems = 0;
  float weight_decay = 0.0f;
  bool operator==(const AdamWPiece& other) const {
    return begin_elems == other.begin_elems && end_elems == other.end_elems &&
           weight_decay == other.weight_decay;
  }
};

// Each struct lists its outputs first, then its inputs, its sizes, and how it writes.
// ---- embedding: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] ---------------------------
template <class T>
struct EmbeddingForwardArgs {
  T* out = nullptr;
  const int32_t* tokens = nullptr;
  const T *wte = nullptr, *wpe = nullptr;
  int batch = 0, seq = 0, channels = 0;
};

// dwte[tokens[n],:] += dout[n,:] and dwpe[t,:] += dout[b,t,:].
template <class T>
struct EmbeddingBackwardArgs {
  float *dwte = nullptr, *dwpe = nullptr;
  const T* dout = nullptr;
  const int32_t* tokens = nullptr;
  int batch = 0, seq = 0, channels = 0;
};

// ---- LayerNorm over rows of C channels ------------------------------------------------
template <class T>
struct LayerNormForwardArgs {
  T* out = nullptr;
  float* mean = nullptr;  // [rows], kept for the backward
  float* rstd = nullptr;  // [rows], kept for the backward
  const T *inp = nullptr, *weight = nullptr, *bias = nullptr;
  int rows = 0, channels = 0;
  int out_stride = 0;  // 0: plain rows; otherwise augmented rows (above)
};

// dinp (+)= the input gradient as dinp_write says; dweight and dbias accumulated.
template <class T>
struct LayerNormBackwardArgs {
  T* dinp = nullptr;
  float *dweight = nullptr, *dbias = nullptr;
  const T *dout = nullptr, *inp = nullptr, *weight = nullptr;
  const float *mean = nullptr, *rstd = nullptr;
  int rows = 0, channels = 0;
  GradientWrite dinp_write = GradientWrite::accumulate;
};

// ---- dense layer: out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] -------------------
// bias may be null (the tied LM head has none). inp's rows are plain or augmented
// (inp_stride), out's plain. With a residual, out = residual + (inp @ weight^T + bias): the
// residual stream's add, done where the GEMM writes its result (residual may not alias out).
template <class T>
struct MatmulForwardArgs {
  T* out = nullptr;
  const T *inp = nullptr, *weight = nullptr, *bias = nullptr;
  int rows = 0, in_channels = 0, out_channels = 0;
  int inp_stride = 0;  // 0: plain rows; otherwise augmented rows (above)
  const T* residual = nullptr;  // [N, OC], or null
};

// dinp (+)= dout @ weight as dinp_write says; dweight += dout^T @ inp; dbias += column
// sums of dout (dbias may be null: a layer without a bias). inp's rows are plain or
// augmented (inp_stride), dinp's plain.
template <class T>
struct MatmulBackwardArgs {
  T* dinp = nullptr;
  float *dweight = nullptr, *dbias = nullptr;
  const T *dout = nullptr, *inp = nullptr, *weight = nullptr;
  int rows = 0, in_channels = 0, out_channels = 0;
  GradientWrite dinp_write = GradientWrite::accumulate;
  int inp_stride = 0;
};

// pre = inp @ weight^T + bias and out = gelu(pre), both written; bias may be null.
template <class T>
struct DenseGeluForwardArgs {
  T* pre = nullptr;  // may be null where no backward follows: then it is not kept
  T* out = nullptr;
  const T *inp = nullptr, *weight = nullptr, *bias = nullptr;
  int rows = 0, in_channels = 0, out_channels = 0;
  int inp_stride = 0;  // 0: plain rows; otherwise augmented rows (above)
  int out_stride = 0;  // out's rows likewise; pre's are plain
};

// The backward of out = act @ weight^T + bias with act = gelu(pre), carried on through the
// GELU: dpre written, dweight and dbias accumulated (dbias may be null). dact_scratch
// [rows, in_channels] is where a backend that needs the gradient of act in memory keeps
// it; its contents afterwards are unspecified.
template <class T>
struct DenseGeluBackwardArgs {
  T* dpre = nullptr;
  float *dweight = nullptr, *dbias = nullptr;
  const T *dout = nullptr, *act = nullptr, *pre = nullptr, *weight = nullptr;
  int rows = 0, in_channels = 0, out_channels = 0;
  T* dact_scratch = nullptr;
  int act_stride = 0;  // act's rows: plain (0) or augmented (above); the others' plain
};

// ---- the classifier: the tied LM head (no bias) and the cross-entropy ------------------
// logits[N,V] = inp[N,C] @ weight[V,C]^T, then the loss; with dlogits_scale, the logits
// are left holding dlogits for that loss scale. losses: [rows]; row_stats: [2 rows], each
// row's max logit and 1 / sum(exp(logit - max)).
template <class T>
struct ClassifierForwardArgs {
  // losses null: the logits alone (inference); then row_stats, targets and dlogits_scale
  // are unused.
  float *losses = nullptr, *row_stats = nullptr;
  T* logits = nullptr;
  const T *inp = nullptr, *weight = nullptr;
  const int32_t* targets = nullptr;
  int rows = 0, channels = 0, vocab = 0;
  std::optional<float> dlogits_scale;
};

// dinp (+)= dlogits @ weight, as dinp_write says.
template <class T>
struct ClassifierInputGradientArgs {
  T* dinp = nullptr;
  const T *dlogits = nullptr, *weight = nullptr;
  int rows = 0, channels = 0, vocab = 0;
  GradientWrite dinp_write = GradientWrite::accumulate;
};

// dweight's rows [vocab_begin, vocab_end) += their columns of dlogits^T @ inp; dweight
// points at row 0 and vocab_begin is a multiple of 8.
template <class T>
struct ClassifierWeightGradientArgs {
  float* dweight = nullptr;
  const T *dlogits = nullptr, *inp = nullptr;
  int rows = 0, channels = 0, vocab = 0;
  int vocab_begin = 0, vocab_end = 0;
};

// The whole backward after a forward without dlogits_scale: logits overwritten with
// dlogits for loss_scale, then dinp (+)= dlogits @ weight as dinp_write says.
template <class T>
struct ClassifierBackwardArgs {
  T *dinp = nullptr, *logits = nullptr;
  const float* row_stats = nullptr;
  const T* weight = nullptr;
  const int32_t* targets = nullptr;
  int rows = 0, channels = 0, vocab = 0;
  float loss_scale = 1.0f;
  GradientWrite dinp_write = GradientWrite::accumulate;
};

// The input gradient of that backward, from the dlogits it leaves in the logits.
template <class T>
ClassifierInputGradientArgs<T> input_gradient_of(const ClassifierBackwardArgs<T>& args) {
  return {args.dinp, args.logits, args.weight, args.rows, args.channels, args.vocab,
          args.dinp_write};
}

}  // namespace scalestudy
