// Multi-head attention of the CUDA backend against the CPU reference: the cuBLAS path in
// fp32, bf16 and fp16 at the op shapes; then the fused (flash) kernels of
// kernels/flash_attention.cuh in bf16 and fp16 (CpuOps::attention_forward /
// attention_backward on the same 16-bit-rounded inputs) and their determinism.
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
  auto raw_qkv = random_floats(qkv_elems, 70, -c.input_range, c.input_range);
  for (size_t token = 0; token < tokens; ++token) {
    const float growth = 1.0f + (c.key_growth - 1.0f) * float(token % c.seq) / float(c.seq);
    for (size_t k = 0; k < C; ++k) raw_qkv[token * 3 * C + C + k] *= growth;
  }
  const auto qkv = rounded(raw_qkv);
  const auto dout = rounded(random_floats(out_elems, 71));

  Reference ref;
  CpuOps cpu;
  std::vector<float> probs(lse_elems * c.seq);
  ref.out.resize(out_elems);
  cpu.attention_forward(ref.out.data(), probs.data(), qkv.data(), shape);
  std::vector<float> grad(qkv_elems, 0.0f);
  cpu.attention_backward(grad.data(), dout.data(), qkv.data(), ref.out.data(), probs.data(),
                         shape, GradientWrite::accumulate);
  compute_bounds(precision, qkv, dout, shape, ref);
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
  for (double& bound : ref.out_bound) bound *= 1.0 + 2.0 * u;

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

SCALESTUDY_SHAPE_TESTS();

}  // namespace
}  // namespace scalestudy::gpu_test
