#include "backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/memory_estimate.h"

namespace scalestudy {
namespace {

// Cache-line alignment, so that the contiguous inner loops vectorise on aligned data and
// two tensors never share a line.
constexpr size_t kAlignmentBytes = 64;
// Rows a matmul handles together: each weight row is then read from L1 once per block
// rather than once per row. The per-element arithmetic does not depend on the block,
// so the results do not either.
constexpr int kMatmulRowBlock = 8;
// Rows whose inputs stay cache-resident while every weight-gradient row sweeps over them.
constexpr int kWeightGradRowBlock = 64;

// A dot product with eight independent partial sums, combined in a fixed tree. The
// compiler can vectorise it without reassociating (no -ffast-math), and the order of
// additions, hence the result, is fixed for a given length.
constexpr int kDotLanes = 8;
float dot(const float* a, const float* b, int elems) {
  float lanes[kDotLanes] = {};
  int i = 0;
  for (; i + kDotLanes <= elems; i += kDotLanes) {
    for (int lane = 0; lane < kDotLanes; ++lane) lanes[lane] += a[i + lane] * b[i + lane];
  }
  float tail = 0.0f;
  for (; i < elems; ++i) tail += a[i] * b[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + tail;
}

// dst += factor * src, in blocks of kDotLanes: the project builds at -O2, where GCC only
// vectorises straight-line blocks, and restrict lets it load a block before storing it.
// Callers never pass overlapping rows.
void axpy(float* __restrict dst, float factor, const float* __restrict src, int elems) {
  int i = 0;
  for (; i + kDotLanes <= elems; i += kDotLanes) {
    for (int lane = 0; lane < kDotLanes; ++lane) dst[i + lane] += factor * src[i + lane];
  }
  for (; i < elems; ++i) dst[i] += factor * src[i];
}

void check_positive(int value, const char* what) {
  SCALESTUDY_CHECK(value > 0, std::string(what) + " must be positive, got " +
                                  std::to_string(value));
}

void check_embedding_shape(int batch, int seq, int channels) {
  check_positive(batch, "embedding batch");
  check_positive(seq, "embedding seq");
  check_positive(channels, "embedding channels");
}

// The sizes of a dense layer's GEMMs: rows by in_channels into out_channels.
void check_gemm_shape(const std::string& layer, int rows, int in_channels, int out_channels) {
  if (rows > 0 && in_channels > 0 && out_channels > 0) return;
  check_positive(rows, (layer + " rows").c_str());
  check_positive(in_channels, (layer + " in_channels").c_str());
  check_positive(out_channels, (layer + " out_channels").c_str());
}

// The reference's overwrite is a zero fill before accumulating: the definition of
// GradientWrite::overwrite that every other backend is compared against.
void start_input_gradient(float* dinp, size_t elems, GradientWrite dinp_write) {
  if (dinp_write == GradientWrite::overwrite) std::fill_n(dinp, elems, 0.0f);
}

}  // namespace

// ---- memory -------------------------------------------------------------------------

CpuOps::~CpuOps() {
  for (auto& entry : allocations_) std::free(entry.first);
}

void* CpuOps::allocate_bytes(size_t bytes, MemoryKind kind) {
  // aligned_alloc wants a multiple of the alignment, and a zero-byte request would be
  // allowed to return null, which callers would mistake for failure.
  const bool representable = bytes <= std::numeric_limits<size_t>::max() - kAlignmentBytes;
  size_t padded_bytes = std::max(kAlignmentBytes,
                                 (bytes + kAlignmentBytes - 1) / kAlignmentBytes * kAlignmentBytes);
  void* ptr = representable ? std::aligned_alloc(kAlignmentBytes, padded_bytes) : nullptr;
  if (ptr == nullptr)
    throw OutOfMemoryError(kind, bytes, "cpu backend",
                           human_bytes(host_available_bytes()) + " available on the host");
  std::lock_guard<std::mutex> lock(memory_mutex_);
  allocations_[ptr] = Allocation{bytes, kind};
  bytes_by_kind_[static_cast<size_t>(kind)] += bytes;
  return ptr;
}

float* CpuOps::allocate_floats(size_t elems, MemoryKind kind) {
  return static_cast<float*>(allocate_bytes(floats_bytes(elems, kind), kind));
}

int32_t* CpuOps::allocate_ints(size_t elems, MemoryKind kind) {
  return static_cast<int32_t*>(allocate_bytes(ints_bytes(elems), kind));
}

void CpuOps::release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    auto found = allocations_.find(ptr);
    SCALESTUDY_CHECK(found != allocations_.end(),
                     "cpu backend: release of a pointer this backend did not allocate");
    bytes_by_kind_[static_cast<size_t>(found->second.kind)] -= found->second.bytes;
    allocations_.erase(found);
  }
  std::free(ptr);
}

size_t CpuOps::allocated_bytes(MemoryKind kind) const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return bytes_by_kind_[static_cast<size_t>(kind)];
}

void CpuOps::fill_zero(float* dst, size_t elems) { std::fill_n(dst, elems, 0.0f); }

// memmove, because a caller may copy a buffer onto an overlapping view of itself.
void CpuOps::copy(float* dst, const float* src, size_t elems) {
  if (elems > 0) std::memmove(dst, src, elems * sizeof(float));
}

void CpuOps::copy_to_host(float* host_dst, const float* src, size_t elems) {
  copy(host_dst, src, elems);
}

void CpuOps::copy_from_host(float* dst, const float* host_src, size_t elems) {
  copy(dst, host_src, elems);
}

void CpuOps::copy_ints_from_host(int32_t* dst, const int32_t* host_src, size_t elems) {
  if (elems > 0) std::memmove(dst, host_src, elems * sizeof(int32_t));
}

float* CpuOps::allocate_attention_state(const AttentionShape& shape) {
  return allocate_floats(attention_probs_elems(shape), MemoryKind::activations);
}

float* CpuOps::allocate_logits(int rows, int vocab) {
  return allocate_floats(static_cast<size_t>(rows) * vocab, MemoryKind::activations);
}

// ---- embedding ----------------------------------------------------------------------

void CpuOps::embedding_forward(const EmbeddingForwardArgs<float>& args) {
  const auto& [out, tokens, wte, wpe, batch, seq, channels] = args;
  check_embedding_shape(batch, seq, channels);
  for (size_t row = 0; row < static_cast<size_t>(batch) * seq; ++row) {
    const int32_t token = tokens[row];
    SCALESTUDY_CHECK(token >= 0, "embedding: negative token id " + std::to_string(token));
    float* out_row = out + row * channels;
    const float* token_row = wte + static_cast<size_t>(token) * channels;
    const float* position_row = wpe + (row % seq) * channels;
    for (int c = 0; c < channels; ++c) out_row[c] = token_row[c] + position_row[c];
  }
}

// Rows are visited in order, so repeated tokens add into dwte in a fixed order.
void CpuOps::embedding_backward(const EmbeddingBackwardArgs<float>& args) {
  const auto& [dwte, dwpe, dout, tokens, batch, seq, channels] = args;
  check_embedding_shape(batch, seq, channels);
  for (size_t row = 0; row < static_cast<size_t>(batch) * seq; ++row) {
    const float* dout_row = dout + row * channels;
    axpy(dwte + static_cast<size_t>(tokens[row]) * channels, 1.0f, dout_row, channels);
    axpy(dwpe + (row % seq) * channels, 1.0f, dout_row, channels);
  }
}

// ---- LayerNorm ----------------------------------------------------------------------

// Mean and variance accumulate in double: with C in the thousands a float sum loses the
// digits that the subtraction x - mean then needs.
void CpuOps::layernorm_forward(const LayerNormForwardArgs<float>& args) {
  const auto& [out, mean, rstd, inp, weight, bias, rows, channels, out_stride] = args;
  check_positive(rows, "layernorm rows");
  check_positive(channels, "layernorm channels");
  check_row_stride(out_stride, channels, "layernorm out");
  for (int n = 0; n < rows; ++n) {
    const float* x = inp + static_cast<size_t>(n) * channels;
    float* y = out + static_cast<size_t>(n) * row_stride(out_stride, channels);
    double total = 0.0;
    for (int c = 0; c < channels; ++c) total += x[c];
    double row_mean = total / channels;
    double squared = 0.0;
    for (int c = 0; c < channels; ++c) {
      double centered = x[c] - row_mean;
      squared += centered * centered;
    }
    double row_rstd = 1.0 / std::sqrt(squared / channels + kLayerNormEpsilon);
    for (int c = 0; c < channels; ++c) {
      float normed = static_cast<float>((x[c] - row_mean) * row_rstd);
      y[c] = normed * weight[c] + bias[c];
    }
    if (out_stride != 0) {
      for (int c = 0; c < kAugmentedColumns; ++c) y[channels + c] = c == 0 ? 1.0f : 0.0f;
    }
    mean[n] = static_cast<float>(row_mean);
    rstd[n] = static_cast<float>(row_rstd);
  }
}

void CpuOps::layernorm_backward(const LayerNormBackwardArgs<float>& args) {
  const auto& [dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels, dinp_write] = args;
  check_positive(rows, "layernorm rows");
  check_positive(channels, "layernorm channels");
  start_input_gradient(dinp, static_cast<size_t>(rows) * channels, dinp_write);
  for (int n = 0; n < rows; ++n) {
    size_t offset = static_cast<size_t>(n) * channels;
    const float* x = inp + offset;
    const float* dy = dout + offset;
    float* dx = dinp + offset;
    float row_mean = mean[n];
    float row_rstd = rstd[n];
    // The two projections that normalisation removes from the upstream gradient: its
    // mean, and its component along the normalised input.
    double dnorm_total = 0.0;
    double dnorm_dot_norm = 0.0;
    for (int c = 0; c < channels; ++c) {
      float normed = (x[c] - row_mean) * row_rstd;
      float dnorm = weight[c] * dy[c];
      dnorm_total += dnorm;
      dnorm_dot_norm += static_cast<double>(dnorm) * normed;
    }
    float dnorm_mean = static_cast<float>(dnorm_total / channels);
    float dnorm_norm_mean = static_cast<float>(dnorm_dot_norm / channels);
    for (int c = 0; c < channels; ++c) {
      float normed = (x[c] - row_mean) * row_rstd;
      float dnorm = weight[c] * dy[c];
      dbias[c] += dy[c];
      dweight[c] += normed * dy[c];
      dx[c] += row_rstd * (dnorm - dnorm_mean - normed * dnorm_norm_mean);
    }
  }
}

// ---- dense layer --------------------------------------------------------------------

void CpuOps::matmul_forward(const MatmulForwardArgs<float>& args) {
  const auto& [out, inp, weight, bias, rows, in_channels, out_channels, inp_stride, residual] = args;
  check_gemm_shape("matmul", rows, in_channels, out_channels);
  check_row_stride(inp_stride, in_channels, "matmul inp");
  const size_t inp_row_elems = static_cast<size_t>(row_stride(inp_stride, in_channels));
  for (int row_begin = 0; row_begin < rows; row_begin += kMatmulRowBlock) {
    int row_end = std::min(rows, row_begin + kMatmulRowBlock);
    for (int o = 0; o < out_channels; ++o) {
      const float* weight_row = weight + static_cast<size_t>(o) * in_channels;
      float bias_value = bias != nullptr ? bias[o] : 0.0f;
      for (int n = row_begin; n < row_end; ++n) {
        const float* x = inp + static_cast<size_t>(n) * inp_row_elems;
        const size_t at = static_cast<size_t>(n) * out_channels + o;
        const float layer = bias_value + dot(x, weight_row, in_channels);
        out[at] = residual != nullptr ? residual[at] + layer : layer;
      }
    }
  }
}

namespace {

// The sizes of a dense layer's GEMMs: rows by in_channels into out_channels, the input's
// rows inp_stride apart (0: in_channels).
struct DenseShape {
  int rows;
  int in_channels;
  int out_channels;
  int inp_stride = 0;
};

// dinp[n,:] += sum_o dout[n,o] * weight[o,:]: contiguous rows of the weight, summed in
// increasing o for every element.
void add_input_gradient(float* dinp, const float* dout, const float* weight, DenseShape shape) {
  const auto [rows, in_channels, out_channels, inp_stride] = shape;
  for (int row_begin = 0; row_begin < rows; row_begin += kMatmulRowBlock) {
    int row_end = std::min(rows, row_begin + kMatmulRowBlock);
    for (int o = 0; o < out_channels; ++o) {
      const float* weight_row = weight + static_cast<size_t>(o) * in_channels;
      for (int n = row_begin; n < row_end; ++n) {
        float factor = dout[static_cast<size_t>(n) * out_channels + o];
        axpy(dinp + static_cast<size_t>(n) * in_channels, factor, weight_row, in_channels);
      }
    }
  }
}

// dweight[o,:] += sum_n dout[n,o] * inp[n,:] for o in [out_begin, out_end), summed in
// increasing n whatever the block or the range.
void add_weight_gradient(float* dweight, const float* dout, const float* inp, DenseShape shape,
                         int out_begin, int out_end) {
  const auto [rows, in_channels, out_channels, inp_stride] = shape;
  const size_t inp_row_elems = static_cast<size_t>(row_stride(inp_stride, in_channels));
  for (int row_begin = 0; row_begin < rows; row_begin += kWeightGradRowBlock) {
    int row_end = std::min(rows, row_begin + kWeightGradRowBlock);
    for (int o = out_begin; o < out_end; ++o) {
      float* dweight_row = dweight + static_cast<size_t>(o) * in_channels;
      for (int n = row_begin; n < row_end; ++n) {
        float factor = dout[static_cast<size_t>(n) * out_channels + o];
        axpy(dweight_row, factor, inp + static_cast<size_t>(n) * inp_row_elems, in_channels);
      }
    }
  }
}

}  // namespace

void CpuOps::matmul_backward(const MatmulBackwardArgs<float>& args) {
  const auto& [dinp, dweight, dbias, dout, inp, weight, rows, in_channels, out_channels, dinp_write,
               inp_stride] = args;
  check_gemm_shape("matmul", rows, in_channels, out_channels);
  check_row_stride(inp_stride, in_channels, "matmul inp");
  start_input_gradient(dinp, static_cast<size_t>(rows) * in_channels, dinp_write);
  add_input_gradient(dinp, dout, weight, {rows, in_channels, out_channels});
  add_weight_gradient(dweight, dout, inp, {rows, in_channels, out_channels, inp_stride}, 0,
                      out_channels);
  // dout's column sums, over augmented rows too: the ones column is not read here.
  if (dbias != nullptr) {
    std::vector<double> bias_totals(static_cast<size_t>(out_channels), 0.0);
    for (int n = 0; n < rows; ++n) {
      const float* dy = dout + static_cast<size_t>(n) * out_channels;
      for (int o = 0; o < out_channels; ++o) bias_totals[o] += dy[o];
    }
    for (int o = 0; o < out_channels; ++o) dbias[o] += static_cast<float>(bias_totals[o]);
  }
}

void CpuOps::classifier_backward_from_dlogits(const ClassifierInputGradientArgs<float>& args) {
  const auto& [dinp, dlogits, weight, rows, channels, vocab, dinp_write] = args;
  check_gemm_shape("classifier", rows, channels, vocab);
  start_input_gradient(dinp, static_cast<size_t>(rows) * channels, dinp_write);
  add_input_gradient(dinp, dlogits, weight, {rows, channels, vocab});
}

void CpuOps::classifier_weight_backward(const ClassifierWeightGradientArgs<float>& args) {
  const auto& [dweight, dlogits, inp, rows, channels, vocab, vocab_begin, vocab_end] = args;
  check_gemm_shape("classifier", rows, channels, vocab);
  SCALESTUDY_CHECK(vocab_begin >= 0 && vocab_begin < vocab_end && vocab_end <= vocab &&
                       vocab_begin % 8 == 0,
                   "classifier_weight_backward: rows must be a non-empty range from a multiple of 8");
  add_weight_gradient(dweight, dlogits, inp, {rows, channels, vocab}, vocab_begin, vocab_end);
}

// ---- attention ----------------------------------------------------------------------

void CpuOps::attention_forward(float* out, float* probs, const float* qkv,
                               const AttentionShape& shape) {
  SCALESTUDY_CHECK(shape.out_stride == 0, "cpu attention_forward: out's rows are plain here");
  const int head_size = attention_head_size(shape);
  const int seq = shape.seq;
  const int channels = shape.channels;
  const size_t qkv_row_elems = 3 * static_cast<size_t>(channels);
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(head_size));
  std::vector<float> scores(static_cast<size_t>(seq));
  for (int b = 0; b < shape.batch; ++b) {
    const float* qkv_batch = qkv + static_cast<size_t>(b) * seq * qkv_row_elems;
    for (int h = 0; h < shape.heads; ++h) {
      const size_t head_offset = static_cast<size_t>(h) * head_size;
      for (int t = 0; t < seq; ++t) {
        const float* query = qkv_batch + t * qkv_row_elems + head_offset;
        const int key_count = shape.causal ? t + 1 : seq;
        float max_score = -INFINITY;
        for (int t2 = 0; t2 < key_count; ++t2) {
          const float* key = qkv_batch + t2 * qkv_row_elems + channels + head_offset;
          scores[t2] = dot(query, key, head_size) * score_scale;
          max_score = std::max(max_score, scores[t2]);
        }
        // Subtracting the row max keeps every exponent <= 0, so nothing overflows.
        double exp_total = 0.0;
        for (int t2 = 0; t2 < key_count; ++t2) {
          scores[t2] = std::exp(scores[t2] - max_score);
          exp_total += scores[t2];
        }
        const float inverse_total = static_cast<float>(1.0 / exp_total);
        float* prob_row =
            probs + ((static_cast<size_t>(b) * shape.heads + h) * seq + t) * seq;
        for (int t2 = 0; t2 < key_count; ++t2) prob_row[t2] = scores[t2] * inverse_total;
        // Masked keys are stored as exact zeros so that the backward (and any consumer of
        // probs) can treat every row as a full distribution over T.
        for (int t2 = key_count; t2 < seq; ++t2) prob_row[t2] = 0.0f;

        float* out_head = out + (static_cast<size_t>(b) * seq + t) * channels + head_offset;
        std::fill_n(out_head, head_size, 0.0f);
        for (int t2 = 0; t2 < key_count; ++t2) {
          const float* value = qkv_batch + t2 * qkv_row_elems + 2 * channels + head_offset;
          axpy(out_head, prob_row[t2], value, head_size);
        }
      }
    }
  }
}

// Softmax backward in its O(T) form: dscore[t2] = p[t2] * (dp[t2] - sum_t3 p[t3] dp[t3]).
void CpuOps::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* /*out*/,
                                const float* probs, const AttentionShape& shape,
                                GradientWrite dqkv_write) {
  const int head_size = attention_head_size(shape);
  const int seq = shape.seq;
  const int channels = shape.channels;
  start_input_gradient(dqkv, static_cast<size_t>(shape.batch) * seq * 3 * channels, dqkv_write);
  const size_t qkv_row_elems = 3 * static_cast<size_t>(channels);
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(head_size));
  std::vector<float> dprobs(static_cast<size_t>(seq));
  for (int b = 0; b < shape.batch; ++b) {
    const size_t batch_offset = static_cast<size_t>(b) * seq * qkv_row_elems;
    const float* qkv_batch = qkv + batch_offset;
    float* dqkv_batch = dqkv + batch_offset;
    for (int h = 0; h < shape.heads; ++h) {
      const size_t head_offset = static_cast<size_t>(h) * head_size;
      for (int t = 0; t < seq; ++t) {
        const int key_count = shape.causal ? t + 1 : seq;
        const float* prob_row =
            probs + ((static_cast<size_t>(b) * shape.heads + h) * seq + t) * seq;
        const float* dout_head =
            dout + (static_cast<size_t>(b) * seq + t) * channels + head_offset;
        double weighted_total = 0.0;
        for (int t2 = 0; t2 < key_count; ++t2) {
          const float* value = qkv_batch + t2 * qkv_row_elems + 2 * channels + head_offset;
          float* dvalue = dqkv_batch + t2 * qkv_row_elems + 2 * channels + head_offset;
          dprobs[t2] = dot(dout_head, value, head_size);
          axpy(dvalue, prob_row[t2], dout_head, head_size);
          weighted_total += static_cast<double>(prob_row[t2]) * dprobs[t2];
        }
        const float dprob_mean = static_cast<float>(weighted_total);
        const float* query = qkv_batch + t * qkv_row_elems + head_offset;
        float* dquery = dqkv_batch + t * qkv_row_elems + head_offset;
        for (int t2 = 0; t2 < key_count; ++t2) {
          float dscore = prob_row[t2] * (dprobs[t2] - dprob_mean) * score_scale;
          const float* key = qkv_batch + t2 * qkv_row_elems + channels + head_offset;
          float* dkey = dqkv_batch + t2 * qkv_row_elems + channels + head_offset;
          axpy(dquery, dscore, key, head_size);
          axpy(dkey, dscore, query, head_size);
        }
      }
    }
  }
}

// ---- GELU ---------------------------------------------------------------------------

void CpuOps::gelu_forward(float* out, const float* inp, size_t elems) {
  for (size_t i = 0; i < elems; ++i) {
    float x = inp[i];
    float inner = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + std::tanh(inner));
  }
}

void CpuOps::gelu_backward(float* dinp, const float* inp, const float* dout, size_t elems,
                           GradientWrite dinp_write) {
  start_input_gradient(dinp, elems, dinp_write);
  for (size_t i = 0; i < elems; ++i) {
    float x = inp[i];
    float inner = kGeluScale * (x + kGeluCubic * x * x * x);
    float tanh_inner = std::tanh(inner);
    float sech_squared = 1.0f - tanh_inner * tanh_inner;
    float dinner = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    float local_grad = 0.5f * (1.0f + tanh_inner) + 0.5f * x * sech_squared * dinner;
    dinp[i] += local_grad * dout[i];
  }
}

// ---- accumulate ---------------------------------------------------------------------

void CpuOps::accumulate(float* dst, const float* src, size_t elems) {
  for (size_t i = 0; i < elems; ++i) dst[i] += src[i];
}

// ---- softmax cross-entropy ----------------------------------------------------------

void CpuOps::softmax_cross_entropy_forward(float* losses, float* row_stats, const float* logits,
                                           const int32_t* targets, int rows, int vocab) {
  check_positive(rows, "cross-entropy rows");
  check_positive(vocab, "cross-entropy vocab");
  for (int n = 0; n < rows; ++n) {
    const int32_t target = targets[n];
    SCALESTUDY_CHECK(target >= 0 && target < vocab,
                     "cross-entropy: target " + std::to_string(target) +
                         " outside the vocabulary of " + std::to_string(vocab));
    const float* row = logits + static_cast<size_t>(n) * vocab;
    float max_logit = row[0];
    for (int v = 1; v < vocab; ++v) max_logit = std::max(max_logit, row[v]);
    double exp_total = 0.0;
    for (int v = 0; v < vocab; ++v) exp_total += std::exp(row[v] - max_logit);
    row_stats[2 * n] = max_logit;
    row_stats[2 * n + 1] = static_cast<float>(1.0 / exp_total);
    // log-sum-exp rather than -log(prob): a target probability that underflows in fp32
    // still gets a finite, accurate loss.
    losses[n] = static_cast<float>(std::log(exp_total) + max_logit - row[target]);
  }
}

// Each probability is rounded as exp(x - max) in fp32 times the fp32 1/sum, then scaled:
// the CUDA kernels round the same way.
void CpuOps::softmax_cross_entropy_backward(float* dlogits, const float* logits,
                                            const float* row_stats, const int32_t* targets,
                                            int rows, int vocab, float loss_scale) {
  check_positive(rows, "cross-entropy rows");
  check_positive(vocab, "cross-entropy vocab");
  for (int n = 0; n < rows; ++n) {
    const float* row = logits + static_cast<size_t>(n) * vocab;
    float* dlogit_row = dlogits + static_cast<size_t>(n) * vocab;
    const float max_logit = row_stats[2 * n], inverse_total = row_stats[2 * n + 1];
    for (int v = 0; v < vocab; ++v) {
      const float prob = std::exp(row[v] - max_logit) * inverse_total;
      dlogit_row[v] = loss_scale * prob;
    }
    dlogit_row[targets[n]] -= loss_scale;
  }
}

// Reductions over whole parameter or loss buffers run in double: millions of fp32 terms
// would otherwise lose the small ones entirely.
double CpuOps::sum(const float* x, size_t elems) {
  double total = 0.0;
  for (size_t i = 0; i < elems; ++i) total += x[i];
  return total;
}

// ---- optimizer ----------------------------------------------------------------------

double CpuOps::sum_of_squares(const float* x, size_t elems) {
  double total = 0.0;
  for (size_t i = 0; i < elems; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

void CpuOps::scale(float* x, size_t elems, float factor) {
  for (size_t i = 0; i < elems; ++i) x[i] *= factor;
}

void CpuOps::adamw_update(float* params, const float* grads, float* m, float* v, size_t elems,
                          const AdamWParams& hyper) {
  SCALESTUDY_CHECK(hyper.step >= 1,
                   "adamw: step is 1-based, got " + std::to_string(hyper.step));
  const float beta1 = hyper.beta1;
  const float beta2 = hyper.beta2;
  // Computed once in double: beta^t for large t is where fp32 powers drift.
  const float bias_correction1 = static_cast<float>(1.0 - std::pow(double{beta1}, hyper.step));
  const float bias_correction2 = static_cast<float>(1.0 - std::pow(double{beta2}, hyper.step));
  for (size_t i = 0; i < elems; ++i) {
    float grad = grads[i];
    float m_new = beta1 * m[i] + (1.0f - beta1) * grad;
    float v_new = beta2 * v[i] + (1.0f - beta2) * grad * grad;
    m[i] = m_new;
    v[i] = v_new;
    float m_hat = m_new / bias_correction1;
    float v_hat = v_new / bias_correction2;
    params[i] -= hyper.learning_rate *
                 (m_hat / (std::sqrt(v_hat) + hyper.epsilon) + hyper.weight_decay * params[i]);
  }
}

}  // namespace scalestudy
