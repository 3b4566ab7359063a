// Multi-head attention of the CUDA backend against the CPU reference: the cuBLAS path in
// fp32, bf16 and fp16 at the op shapes; then the fused (flash) kernels of
// kernels/flash_attention.cuh in bf16 and fp16 (CpuOps::attention_forward /
// attention_backward on the same 16-bit-rounded inputs) and their determinism; then cuDNN's
// fused attention (--attention-kernel cudnn) on the same cases, against the same bounds and
// against the flash kernels.
//
// The fused kernels' tolerances.
// Each element is checked against its own bound, computed on the host in
// double from the same inputs, because the error of a sum of rounded terms scales with the
// sum of the terms' magnitudes, not with the result (cancellation makes the result small
// while the errors stay). What each bound covers, with u the unit roundoff of the storage
// (bf16 2^-8, fp16 2^-11) and eta the absolute rounding error below the normal range
// (fp16: half a subnormal step, 2^-25; bf16 shares fp32's range, so 0):
// - The 16-bit roundings the GPU adds: the probabilities for P V and P^T dO (u relative per
//   term), dS for dS K and dS^T Q (u), out before D = rowsum(dout * out) (out's own bound),
//   and the final rounding of every stored result (u |ref|, + eta).
// - fp32, both sides (the CPU reference is fp32 too): a dot product over the head of 64
//   terms is off by at most 64 * 2^-24 of the sum of its terms' magnitudes (eps_dot, doubled
//   for the two sides); sums over up to T keys or queries by T * 2^-24 (eps_sum). A score
//   error moves exp(score) relatively by the same amount, so probabilities carry
//   eps_dot * (|score terms| of the row's largest) + eps_sum + 2^-20 (exp2, 2 ulp).
// These are worst-case (every rounding the same way) bounds; real errors sit well under
// them (each check prints the largest error/bound). A wrong index, a missed or doubled
// tile, a mask off by one or a lost accumulation moves results by O(1) of a term, far
#include "attention.cuh"
#include "backend/cuda/cudnn_attention.h"
#include "cuda_ops_fixture.h"
#include "flash_attention_support.h"

namespace scalestudy::gpu_test {
namespace {

TEST_P(CudaOpsShapes, Attention) {
  const OpShape s = shape();
  const size_t N = s.rows(), C = s.channels, T = s.seq;
  const size_t probs_elems = size_t(s.batch) * s.heads * T * T;
  for (bool causal : {true, false}) {
    const std::string label = causal ? " (causal)" : " (bidirectional)";
    const AttentionShape shape{s.batch, s.seq, s.channels, s.heads, causal};
    const auto qkv = rounded(random_floats(N * 3 * C, 40));
    std::vector<float> out(N * C), probs(probs_elems);
    float *d_out = poisoned_activation(out.size()), *d_probs = poisoned_activation(probs_elems);
    const float* d_qkv = activation(qkv);
    cpu_.attention_forward(out.data(), probs.data(), qkv.data(), shape);
    gpu_->attention_forward(d_out, d_probs, d_qkv, shape);
    expect_close("attention out" + label, d_out, out, tol_.attention_out);
    expect_close("attention probs" + label, d_probs, probs, tol_.probability);
    if (causal) {
      EXPECT_EQ(unmasked_probabilities(download(d_probs, probs_elems), T), 0u)
          << "masked probabilities must be exact zeros";
    }

    // Both sides take the storage's rounding of the CPU's probabilities.
    const auto probs_rounded = rounded(probs);
    const auto dout = rounded(random_floats(N * C, 41));
    for (GradientWrite write : kGradientWrites) {
      auto dqkv = rounded(random_floats(qkv.size(), 42));
      float* d_dqkv =
          write == GradientWrite::accumulate ? activation(dqkv) : poisoned_activation(dqkv.size());
      cpu_.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), probs_rounded.data(),
                              shape, write);
      gpu_->attention_backward(d_dqkv, activation(dout), d_qkv, d_out, activation(probs_rounded),
                               shape, write);
      expect_close("attention dqkv" + label + write_label(write), d_dqkv, dqkv, gemm_tolerance(dqkv));
    }
  }
}

// ---- the fused kernels -------------------------------------------------------------------

struct FlashCase {
  const char* name;
  int batch, seq, channels, heads;
  bool causal;
  float input_range;  // qkv uniform in [-range, range]; 4 makes the softmax peaky
  // Key t is scaled by 1 + (key_growth - 1) t / seq, so later key tiles raise a row's
  // maximum score by large steps (often more than 8 in log2 units): the forward rescales
  // its accumulators by factors far below 1 on tiles after the first.
  float key_growth = 1.0f;
};

const FlashCase kCases[] = {
    {"small_causal", 2, 64, 128, 2, true, 1.0f},
    {"small_bidirectional", 2, 64, 128, 2, false, 1.0f},
    // 77 = one full tile and a tail of 13 rows, in queries and keys.
    {"odd_causal", 2, 77, 128, 2, true, 1.0f},
    {"odd_bidirectional", 2, 77, 128, 2, false, 1.0f},
    {"odd_causal_large_scores", 2, 77, 128, 2, true, 4.0f},
    {"odd_bidirectional_large_scores", 1, 150, 192, 3, false, 4.0f},
    {"single_token", 3, 1, 64, 1, true, 1.0f},
    {"gpt2_layer_causal", 1, 1024, 768, 12, true, 1.0f},
    // Scores (log2 units) of spread about 2 at the first keys and 16 at the last.
    {"rising_scores_causal", 2, 256, 128, 2, true, 2.0f, 8.0f},
    {"rising_scores_bidirectional", 2, 256, 128, 2, false, 2.0f, 8.0f},
};

// ---- the reference and its bounds --------------------------------------------------------

struct Reference {
  // out and dqkv from CpuOps (fp32); lse from compute_bounds (double: CpuOps keeps none).
  std::vector<float> out, lse, dqkv;
  std::vector<double> out_bound, lse_bound, dqkv_bound;
};

double subnormal_rounding(Precision precision) {
  return precision == Precision::fp16 ? 0x1p-25 : 0.0;
}

// Exact-in-double attention of the rounded inputs, for the lse reference (CpuOps keeps
// none) and for the sums of term magnitudes that the bounds scale with (header comment).
// dqkv_bound leaves out the final rounding of the accumulated result, added by the caller.
void compute_bounds(Precision precision, const std::vector<float>& qkv,
                    const std::vector<float>& dout, const AttentionShape& shape, Reference& ref) {
  const int T = shape.seq, C = shape.channels, HS = C / shape.heads;
  const size_t ld = 3 * size_t(C);
  const double scale = 1.0 / std::sqrt(double(HS));
  const double u = unit_roundoff(precision), eta = subnormal_rounding(precision);
  const double eps_dot = 2.0 * HS * 0x1p-24;
  const double eps_sum = T * 0x1p-24;
  ref.lse.assign(size_t(shape.batch) * shape.heads * T, 0.0f);
  ref.lse_bound.assign(ref.lse.size(), 0.0);
  ref.out_bound.assign(size_t(shape.batch) * T * C, 0.0);
  ref.dqkv_bound.assign(qkv.size(), 0.0);
  std::vector<double> score(T), term_sum(T), prob(T);
  std::vector<double> out(HS), out_terms(HS), value_terms(HS);
  for (int b = 0; b < shape.batch; ++b) {
    for (int h = 0; h < shape.heads; ++h) {
      const size_t head = size_t(h) * HS;
      auto q = [&](int t, int d) { return double(qkv[(size_t(b) * T + t) * ld + head + d]); };
      auto k = [&](int t, int d) { return double(qkv[(size_t(b) * T + t) * ld + C + head + d]); };
      auto v = [&](int t, int d) {
        return double(qkv[(size_t(b) * T + t) * ld + 2 * C + head + d]);
      };
      auto bound_at = [&](int t, int part, int d) -> double& {
        return ref.dqkv_bound[(size_t(b) * T + t) * ld + size_t(part) * C + head + d];
      };
      for (int t = 0; t < T; ++t) {
        const int keys = shape.causal ? t + 1 : T;
        double max_score = -INFINITY, max_terms = 0.0;
        for (int t2 = 0; t2 < keys; ++t2) {
          double dot = 0.0, terms = 0.0;
          for (int d = 0; d < HS; ++d) {
            dot += q(t, d) * k(t2, d);
            terms += std::fabs(q(t, d) * k(t2, d));
          }
          score[t2] = dot * scale;
          term_sum[t2] = terms * scale;
          max_score = std::max(max_score, score[t2]);
          max_terms = std::max(max_terms, term_sum[t2]);
        }
        double exp_total = 0.0;
        for (int t2 = 0; t2 < keys; ++t2) exp_total += std::exp(score[t2] - max_score);
        for (int t2 = 0; t2 < keys; ++t2) prob[t2] = std::exp(score[t2] - max_score) / exp_total;
        const double lse = max_score + std::log(exp_total);
        const size_t row = (size_t(b) * shape.heads + h) * T + t;
        ref.lse[row] = static_cast<float>(lse);
        // Relative error of a probability: scores (of the term and of the max), the sum.
        const double prob_error = 2.0 * eps_dot * max_terms + eps_sum + 0x1p-20;
        ref.lse_bound[row] = eps_dot * max_terms + eps_sum + 0x1p-20 + 0x1p-23 * std::fabs(lse);

        // out: the forward rounds exp(score - max) (<= 1, the sum l >= 1) before P V.
        std::fill(out.begin(), out.end(), 0.0);
        std::fill(out_terms.begin(), out_terms.end(), 0.0);
        std::fill(value_terms.begin(), value_terms.end(), 0.0);
        for (int t2 = 0; t2 < keys; ++t2)
          for (int d = 0; d < HS; ++d) {
            out[d] += prob[t2] * v(t2, d);
            out_terms[d] += prob[t2] * std::fabs(v(t2, d));
            value_terms[d] += std::fabs(v(t2, d));
          }
        double* out_bound = &ref.out_bound[(size_t(b) * T + t) * C + head];
        for (int d = 0; d < HS; ++d)
          out_bound[d] = (u + prob_error + eps_sum) * out_terms[d] +
                         eta * value_terms[d] / exp_total + u * std::fabs(out[d]) + eta;

        // Backward of row t. D comes from the stored (rounded) out on the GPU.
        const float* dy = &dout[(size_t(b) * T + t) * C + head];
        double dsum = 0.0, dsum_terms = 0.0, dsum_error = 0.0;
        for (int d = 0; d < HS; ++d) {
          dsum += dy[d] * out[d];
          dsum_terms += std::fabs(dy[d] * out[d]);
          dsum_error += std::fabs(dy[d]) * out_bound[d];
        }
        dsum_error += eps_dot * dsum_terms;
        for (int t2 = 0; t2 < keys; ++t2) {
          double dot = 0.0, terms = 0.0;
          for (int d = 0; d < HS; ++d) {
            dot += dy[d] * v(t2, d);
            terms += std::fabs(dy[d] * v(t2, d));
          }
          const double dscore = prob[t2] * (dot - dsum);
          const double dscore_error = (u + prob_error + eps_sum) * std::fabs(dscore) + eta +
                                      prob[t2] * (dsum_error + eps_dot * terms);
          for (int d = 0; d < HS; ++d) {
            bound_at(t, 0, d) += scale * dscore_error * std::fabs(k(t2, d));
            bound_at(t2, 1, d) += scale * dscore_error * std::fabs(q(t, d));
            bound_at(t2, 2, d) += ((u + prob_error + eps_sum) * prob[t2] + eta) * std::fabs(dy[d]);
          }
        }
      }
    }
  }
}

// ---- checks --------------------------------------------------------------------------------

// |got - ref| <= bound, element by element; prints the first mismatch, and on success the
// largest error/bound (the share of the bound used).
::testing::AssertionResult within_bounds(const std::string& what, const std::vector<float>& got,
                                         const std::vector<float>& ref,
                                         const std::vector<double>& bound) {
  size_t mismatches = 0, first = 0;
  double worst_fraction = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double error = std::fabs(double(got[i]) - double(ref[i]));
    if (!(error <= bound[i]) && mismatches++ == 0) first = i;
    if (bound[i] > 0.0) worst_fraction = std::max(worst_fraction, error / bound[i]);
  }
  if (mismatches == 0) {
    std::cout << "  " << what << ": worst error/bound " << worst_fraction << "\n";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << got.size()
         << " elements out of bounds; first at index " << first << ": gpu " << got[first]
         << ", cpu " << ref[first] << ", bound " << bound[first];
}

class FlashAttentionCases
    : public FlashAttentionTest,
      public ::testing::WithParamInterface<std::tuple<Precision, FlashCase>> {};


// The rounded inputs of a case: qkv, with the keys growing along the sequence as the case
// says, and dout.
struct CaseInputs {
  std::vector<float> qkv, dout;
};

CaseInputs case_inputs(Precision precision, const FlashCase& c) {
  const size_t tokens = size_t(c.batch) * c.seq, C = c.channels;
  auto raw_qkv = random_floats(tokens * 3 * C, 70, -c.input_range, c.input_range);
  for (size_t token = 0; token < tokens; ++token) {
    const float growth = 1.0f + (c.key_growth - 1.0f) * float(token % c.seq) / float(c.seq);
    for (size_t k = 0; k < C; ++k) raw_qkv[token * 3 * C + C + k] *= growth;
  }
  CaseInputs inputs{raw_qkv, random_floats(tokens * C, 71)};
  for (auto* values : {&inputs.qkv, &inputs.dout})
    for (float& value : *values) value = round_to_storage(precision, value);
  return inputs;
}

// The CPU's out and the gradients of qkv (into `grad`, from zeros), with compute_bounds'
// bounds; out's bound includes its final rounding, dqkv's does not yet.
Reference case_reference(Precision precision, const FlashCase& c, const CaseInputs& inputs,
                         std::vector<float>& grad) {
  const AttentionShape shape{c.batch, c.seq, c.channels, c.heads, c.causal};
  Reference ref;
  CpuOps cpu;
  std::vector<float> probs(size_t(c.batch) * c.heads * c.seq * c.seq);
  ref.out.resize(size_t(c.batch) * c.seq * c.channels);
  cpu.attention_forward(ref.out.data(), probs.data(), inputs.qkv.data(), shape);
  grad.assign(inputs.qkv.size(), 0.0f);
  cpu.attention_backward(grad.data(), inputs.dout.data(), inputs.qkv.data(), ref.out.data(), probs.data(),
                         shape, GradientWrite::accumulate);
  compute_bounds(precision, inputs.qkv, inputs.dout, shape, ref);
  for (double& bound : ref.out_bound) bound *= 1.0 + 2.0 * unit_roundoff(precision);
  return ref;
}

TEST_P(FlashAttentionCases, MatchesCpuReference) {
  const Precision precision = std::get<0>(GetParam());
  const FlashCase c = std::get<1>(GetParam());
  const AttentionShape shape{c.batch, c.seq, c.channels, c.heads, c.causal};
  ASSERT_TRUE(cuda::flash_attention_supported(shape));
  const size_t tokens = size_t(c.batch) * c.seq, C = c.channels;
  const size_t qkv_elems = tokens * 3 * C, out_elems = tokens * C;
  const size_t lse_elems = tokens * c.heads;
  auto rounded = [&](std::vector<float> values) {
    for (float& value : values) value = round_to_storage(precision, value);
    return values;
  };
  const CaseInputs inputs = case_inputs(precision, c);
  const auto& qkv = inputs.qkv;
  const auto& dout = inputs.dout;
  std::vector<float> grad;
  Reference ref = case_reference(precision, c, inputs, grad);
  // A prior of the gradient's own scale: the kernels must add to it (a prior of 1 would
  // hide the gradient's errors under the final rounding of the prior).
  float grad_scale = 0.0f;
  for (float g : grad) grad_scale = std::max(grad_scale, std::fabs(g));
  auto prior = random_floats(qkv_elems, 72, -grad_scale, grad_scale);
  prior = rounded(prior);
  const double u = unit_roundoff(precision), eta = subnormal_rounding(precision);
  ref.dqkv.resize(qkv_elems);
  for (size_t i = 0; i < qkv_elems; ++i) {
    ref.dqkv[i] = prior[i] + grad[i];
    // The final rounding, and (1 + 2u) for the second-order terms the sums leave out.
    ref.dqkv_bound[i] = (1.0 + 2.0 * u) * (ref.dqkv_bound[i] + u * std::fabs(ref.dqkv[i])) +
                        c.seq * 0x1p-24 * std::fabs(prior[i]) + eta;
  }

  DeviceBuffer d_qkv(qkv_elems * 2), d_out(out_elems * 2), d_lse(lse_elems * 4);
  DeviceBuffer d_dout(out_elems * 2), d_dqkv(qkv_elems * 2);
  DeviceBuffer scratch(cuda::flash_attention_backward_scratch_elems(shape) * 4);
  upload_half(d_qkv, precision, qkv);
  upload_half(d_dout, precision, dout);
  upload_half(d_dqkv, precision, prior);
  d_out.poison();
  d_lse.poison();
  scratch.poison();
  flash_forward(precision, stream_, d_out, d_lse, d_qkv, shape);
  flash_backward(precision, stream_, {d_dqkv, d_dout, d_qkv, d_out, d_lse}, shape, scratch);
  CHECK_CUDA(cudaStreamSynchronize(stream_));

  const std::string label = std::string(precision_name(precision)) + " " + c.name;
  EXPECT_TRUE(within_bounds(label + " out", download_half(d_out, precision, out_elems), ref.out,
                            ref.out_bound));
  EXPECT_TRUE(within_bounds(label + " lse", download_floats(d_lse, lse_elems), ref.lse,
                            ref.lse_bound));
  EXPECT_TRUE(within_bounds(label + " dqkv", download_half(d_dqkv, precision, qkv_elems),
                            ref.dqkv, ref.dqkv_bound));

  // Overwriting, the backward writes dqkv without reading it (it starts as NaN here), and
  // gives the values of accumulating onto zeros: 0 + g is exact before the one rounding.
  DeviceBuffer from_zero(qkv_elems * 2), overwritten(qkv_elems * 2);
  CHECK_CUDA(cudaMemset(from_zero.as<void>(), 0, from_zero.bytes()));
  overwritten.poison();
  flash_backward(precision, stream_, {from_zero, d_dout, d_qkv, d_out, d_lse}, shape, scratch,
                 GradientWrite::accumulate);
  flash_backward(precision, stream_, {overwritten, d_dout, d_qkv, d_out, d_lse}, shape, scratch,
                 GradientWrite::overwrite);
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_EQ(download_half(overwritten, precision, qkv_elems),
            download_half(from_zero, precision, qkv_elems))
      << label << ": dqkv overwritten";
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Precision, FlashCase>>& info) {
  return std::string(precision_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionCases,
                         ::testing::Combine(::testing::Values(Precision::bf16, Precision::fp16),
                                            ::testing::ValuesIn(kCases)),
                         case_name);

// Two runs of forward + backward on the same inputs give the same bits (no atomics, fixed
// orders), at a size that fills the GPU so that block scheduling varies between runs.
TEST_F(FlashAttentionTest, DeterministicAcrossRuns) {
  for (Precision precision : {Precision::bf16, Precision::fp16}) {
    for (bool causal : {true, false}) {
      const AttentionShape shape{4, 1000, 768, 12, causal};
      const size_t tokens = size_t(shape.batch) * shape.seq, C = shape.channels;
      const auto qkv = random_floats(tokens * 3 * C, 80, -2.0f, 2.0f);
      const auto dout = random_floats(tokens * C, 81);
      const auto prior = random_floats(tokens * 3 * C, 82, -0.01f, 0.01f);
      DeviceBuffer d_qkv(qkv.size() * 2), d_dout(dout.size() * 2);
      DeviceBuffer scratch(cuda::flash_attention_backward_scratch_elems(shape) * 4);
      upload_half(d_qkv, precision, qkv);
      upload_half(d_dout, precision, dout);
      DeviceBuffer out_a(tokens * C * 2), out_b(tokens * C * 2);
      DeviceBuffer lse_a(tokens * shape.heads * 4), lse_b(tokens * shape.heads * 4);
      DeviceBuffer dqkv_a(qkv.size() * 2), dqkv_b(qkv.size() * 2);
      upload_half(dqkv_a, precision, prior);
      upload_half(dqkv_b, precision, prior);
      out_b.poison();
      lse_b.poison();
      flash_forward(precision, stream_, out_a, lse_a, d_qkv, shape);
      flash_backward(precision, stream_, {dqkv_a, d_dout, d_qkv, out_a, lse_a}, shape, scratch);
      flash_forward(precision, stream_, out_b, lse_b, d_qkv, shape);
      flash_backward(precision, stream_, {dqkv_b, d_dout, d_qkv, out_b, lse_b}, shape, scratch);
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      const std::string label =
          std::string(precision_name(precision)) + (causal ? " causal" : " bidirectional");
      EXPECT_TRUE(same_bits(out_a, out_b)) << label << " out";
      EXPECT_TRUE(same_bits(lse_a, lse_b)) << label << " lse";
      EXPECT_TRUE(same_bits(dqkv_a, dqkv_b)) << label << " dqkv";
    }
  }
}

// ---- cuDNN's fused attention (--attention-kernel cudnn) ---------------------------------------
//
// Through CudaOps, as the model runs it, on the cases of the flash kernels and against the
// same references and bounds: cuDNN's SDPA rounds where the flash kernels do (the
// probabilities before P V and P^T dO, dS before dS K and dS^T Q, every stored result once),
// sums in fp32, and keeps the same statistics (the natural-log log-sum-exp of the scaled
// scores), so compute_bounds covers it. Its backward writes dqkv over:
// - overwriting, the reference is the gradient alone, its bound compute_bounds' plus the
//   final rounding (u |ref| + eta, times 1 + 2u for the second-order terms);
// - accumulating, the gradient is rounded to 16 bits once more before it is added to the
//   prior and the sum rounded: u |gradient| and (u + 2^-24) |ref| (fp32 add, final rounding)
//   on top of the gradient's bound, and eta for each of the two 16-bit roundings.
// Against the flash kernels, which lie within the same bounds of the same reference, each
// result differs by at most twice its bound.
class CudnnAttentionCases : public FlashAttentionCases {
 protected:
  void SetUp() override {
    FlashAttentionCases::SetUp();
    if (IsSkipped()) return;
    std::string why_not;
    if (!cudnn_attention_loadable(why_not)) GTEST_SKIP() << "cuDNN's attention unavailable: " << why_not;
  }
};

// A 16-bit activation buffer of the backend holding `values` (already rounded).
float* upload_activation(CudaOps& ops, const std::vector<float>& values) {
  float* device = ops.allocate_floats(values.size(), MemoryKind::activations);
  ops.copy_from_host(device, values.data(), values.size());
  return device;
}

std::vector<float> download_activation(CudaOps& ops, const float* device, size_t elems) {
  std::vector<float> values(elems);
  ops.copy_to_host(values.data(), device, elems);
  return values;
}

// The bound of an overwriting backward (above): compute_bounds' plus the final rounding.
std::vector<double> overwrite_bounds(const Reference& ref, const std::vector<float>& grad,
                                     Precision precision) {
  const double u = unit_roundoff(precision), eta = subnormal_rounding(precision);
  std::vector<double> bounds(grad.size());
  for (size_t i = 0; i < grad.size(); ++i)
    bounds[i] = (1.0 + 2.0 * u) * (ref.dqkv_bound[i] + u * std::fabs(grad[i])) + eta;
  return bounds;
}

std::vector<double> doubled(std::vector<double> bounds) {
  for (double& bound : bounds) bound *= 2.0;
  return bounds;
}

TEST_P(CudnnAttentionCases, MatchesCpuReferenceAndFlash) {
  const Precision precision = std::get<0>(GetParam());
  const FlashCase c = std::get<1>(GetParam());
  const AttentionShape shape{c.batch, c.seq, c.channels, c.heads, c.causal};
  const size_t tokens = size_t(c.batch) * c.seq, C = c.channels;
  const size_t qkv_elems = tokens * 3 * C, out_elems = tokens * C, lse_elems = tokens * c.heads;
  const double u = unit_roundoff(precision), eta = subnormal_rounding(precision);
  const CaseInputs inputs = case_inputs(precision, c);
  std::vector<float> grad;
  Reference ref = case_reference(precision, c, inputs, grad);
  const std::vector<double> overwrite_bound = overwrite_bounds(ref, grad, precision);
  std::vector<double> accumulate_bound(qkv_elems);
  float grad_scale = 0.0f;
  for (float g : grad) grad_scale = std::max(grad_scale, std::fabs(g));
  std::vector<float> prior = random_floats(qkv_elems, 73, -grad_scale, grad_scale);
  for (float& value : prior) value = round_to_storage(precision, value);
  std::vector<float> accumulated(qkv_elems);
  for (size_t i = 0; i < qkv_elems; ++i) {
    accumulated[i] = prior[i] + grad[i];
    accumulate_bound[i] = (1.0 + 2.0 * u) * (ref.dqkv_bound[i] + u * std::fabs(grad[i]) +
                                             (u + 0x1p-24) * std::fabs(accumulated[i])) +
                          3.0 * eta;
  }

  CudaOps ops(0, precision, GemmAlgos::heuristic, AttentionKernel::cudnn);
  ASSERT_EQ(ops.attention_kernel(), AttentionKernel::cudnn);
  ASSERT_TRUE(cudnn_attention_supported(shape));
  const std::vector<float> nan_out(out_elems, NAN), nan_lse(lse_elems, NAN), nan_dqkv(qkv_elems, NAN);
  float* d_qkv = upload_activation(ops, inputs.qkv);
  float* d_dout = upload_activation(ops, inputs.dout);
  float* d_out = upload_activation(ops, nan_out);
  float* d_lse = ops.allocate_attention_state(shape);
  ASSERT_EQ(ops.attention_state_bytes(shape), lse_elems * sizeof(float)) << "cuDNN keeps the log-sum-exp";
  ops.copy_from_host(d_lse, nan_lse.data(), lse_elems);
  float* d_overwritten = upload_activation(ops, nan_dqkv);
  float* d_accumulated = upload_activation(ops, prior);
  ops.attention_forward(d_out, d_lse, d_qkv, shape);
  ops.attention_backward(d_overwritten, d_dout, d_qkv, d_out, d_lse, shape, GradientWrite::overwrite);
  ops.attention_backward(d_accumulated, d_dout, d_qkv, d_out, d_lse, shape, GradientWrite::accumulate);
  const auto out = download_activation(ops, d_out, out_elems);
  std::vector<float> lse(lse_elems);
  ops.copy_to_host(lse.data(), d_lse, lse_elems);
  const auto overwritten = download_activation(ops, d_overwritten, qkv_elems);
  const auto accumulated_gpu = download_activation(ops, d_accumulated, qkv_elems);
  for (float* buffer : {d_qkv, d_dout, d_out, d_lse, d_overwritten, d_accumulated}) ops.release(buffer);

  const std::string label = std::string(precision_name(precision)) + " cudnn " + c.name;
  EXPECT_TRUE(within_bounds(label + " out", out, ref.out, ref.out_bound));
  EXPECT_TRUE(within_bounds(label + " lse", lse, ref.lse, ref.lse_bound));
  EXPECT_TRUE(within_bounds(label + " dqkv overwritten", overwritten, grad, overwrite_bound));
  EXPECT_TRUE(within_bounds(label + " dqkv accumulated", accumulated_gpu, accumulated, accumulate_bound));

  // The flash kernels on the same inputs.
  DeviceBuffer f_qkv(qkv_elems * 2), f_out(out_elems * 2), f_lse(lse_elems * 4);
  DeviceBuffer f_dout(out_elems * 2), f_dqkv(qkv_elems * 2);
  DeviceBuffer scratch(cuda::flash_attention_backward_scratch_elems(shape) * 4);
  upload_half(f_qkv, precision, inputs.qkv);
  upload_half(f_dout, precision, inputs.dout);
  f_dqkv.poison();
  flash_forward(precision, stream_, f_out, f_lse, f_qkv, shape);
  flash_backward(precision, stream_, {f_dqkv, f_dout, f_qkv, f_out, f_lse}, shape, scratch,
                 GradientWrite::overwrite);
  CHECK_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_TRUE(within_bounds(label + " out vs flash", out, download_half(f_out, precision, out_elems),
                            doubled(ref.out_bound)));
  EXPECT_TRUE(within_bounds(label + " lse vs flash", lse, download_floats(f_lse, lse_elems),
                            doubled(ref.lse_bound)));
  EXPECT_TRUE(within_bounds(label + " dqkv vs flash", overwritten, download_half(f_dqkv, precision, qkv_elems),
                            doubled(overwrite_bound)));
}

// Where attention_output_stride says so (channels a multiple of 8), the model's out is in
// augmented rows, which cuDNN writes through its output strides: the values within the
// bounds above, each row followed by (1, 0, ...), and the backward, which reads out at that
// stride, within its bounds.
TEST_P(CudnnAttentionCases, WritesAugmentedRowsThroughItsStrides) {
  const Precision precision = std::get<0>(GetParam());
  const FlashCase c = std::get<1>(GetParam());
  CudaOps ops(0, precision, GemmAlgos::heuristic, AttentionKernel::cudnn);
  AttentionShape shape{c.batch, c.seq, c.channels, c.heads, c.causal};
  shape.out_stride = ops.attention_output_stride(shape);
  if (c.channels % 8 != 0) {
    EXPECT_EQ(shape.out_stride, 0) << "augmented rows need channels a multiple of 8";
    return;
  }
  ASSERT_GE(shape.out_stride, c.channels + kAugmentedColumns);
  const size_t tokens = size_t(c.batch) * c.seq, C = c.channels, stride = shape.out_stride;
  const CaseInputs inputs = case_inputs(precision, c);
  std::vector<float> grad;
  const Reference ref = case_reference(precision, c, inputs, grad);
  float* d_qkv = upload_activation(ops, inputs.qkv);
  float* d_out = upload_activation(ops, std::vector<float>(tokens * stride, NAN));
  float* d_lse = ops.allocate_attention_state(shape);
  float* d_dqkv = upload_activation(ops, std::vector<float>(grad.size(), NAN));
  float* d_dout = upload_activation(ops, inputs.dout);
  ops.attention_forward(d_out, d_lse, d_qkv, shape);
  ops.attention_backward(d_dqkv, d_dout, d_qkv, d_out, d_lse, shape, GradientWrite::overwrite);
  const auto out_rows = download_activation(ops, d_out, tokens * stride);
  const auto dqkv = download_activation(ops, d_dqkv, grad.size());
  for (float* buffer : {d_qkv, d_out, d_lse, d_dqkv, d_dout}) ops.release(buffer);

  std::vector<float> out(tokens * C);
  size_t wrong_augmented_columns = 0;
  for (size_t t = 0; t < tokens; ++t) {
    std::copy_n(out_rows.begin() + t * stride, C, out.begin() + t * C);
    for (size_t k = 0; k < size_t(kAugmentedColumns); ++k)
      wrong_augmented_columns += out_rows[t * stride + C + k] != (k == 0 ? 1.0f : 0.0f);
  }
  const std::string label = std::string(precision_name(precision)) + " cudnn augmented " + c.name;
  EXPECT_EQ(wrong_augmented_columns, 0u) << label << ": the columns after each row";
  EXPECT_TRUE(within_bounds(label + " out", out, ref.out, ref.out_bound));
  EXPECT_TRUE(within_bounds(label + " dqkv", dqkv, grad, overwrite_bounds(ref, grad, precision)));
}

// bf16 only: the run refuses cuDNN in fp16 (run_config.cpp says why), and the cases
// cuDNN takes (not the single token).
std::vector<FlashCase> cudnn_cases() {
  std::vector<FlashCase> cases;
  for (const FlashCase& c : kCases)
    if (cudnn_attention_supported({c.batch, c.seq, c.channels, c.heads, c.causal})) cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionCases,
                         ::testing::Combine(::testing::Values(Precision::bf16), ::testing::ValuesIn(cudnn_cases())),
                         case_name);

// A shape that cuDNN does not take (head size 4) keeps the probabilities, as the flash path
// does for the shapes it does not take, and the choice of kernels stays what was asked.
TEST_F(FlashAttentionTest, CudnnLeavesShapesItDoesNotTakeUnfused) {
  std::string why_not;
  if (!cudnn_attention_loadable(why_not)) GTEST_SKIP() << "cuDNN's attention unavailable: " << why_not;
  CudaOps ops(0, Precision::bf16, GemmAlgos::heuristic, AttentionKernel::cudnn);
  const AttentionShape narrow{2, 16, 8, 2, true};
  EXPECT_FALSE(cudnn_attention_supported(narrow));
  EXPECT_FALSE(cudnn_attention_supported({3, 1, 64, 1, true})) << "one query against one key";
  EXPECT_EQ(ops.attention_state_bytes(narrow), ops.floats_bytes(attention_probs_elems(narrow), MemoryKind::activations));
  EXPECT_EQ(CudaOps(0, Precision::bf16).attention_kernel(), AttentionKernel::flash);
  EXPECT_EQ(CudaOps(0, Precision::bf16, GemmAlgos::heuristic, AttentionKernel::auto_select).attention_kernel(),
            AttentionKernel::flash);
}

SCALESTUDY_SHAPE_TESTS();

}  // namespace
}  // namespace scalestudy::gpu_test
