#pragma once
// What the CPU op tests share: their tolerances and shapes, and the central finite
// differences that every backward is checked against.
//
// Every backward check uses the scalar objective L = sum(out * R) with a fixed random R,
// so the upstream gradient is dout = R. Gradient buffers start from random "prior"
// values, and the check is on (after - prior), which also proves that backward ops
// accumulate (+=) rather than overwrite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "op_checks.h"

namespace scalestudy::cpu_ops_test {

using op_test::all_close;
using op_test::random_floats;
using op_test::Rng;
using op_test::Tolerance;

// fp32 forward against a double reference: a few fp32 roundings of O(1) values over
// reductions of at most ~16 terms.
constexpr Tolerance kForwardTolerance{1e-6, 1e-5};
// Central differences of the fp32 forward with step kFp32Step (relative to max(1,|x|)).
// Truncation vanishes for the linear ops and is ~step^2/6 * |f'''| for LayerNorm and
// GELU; fp32 rounding of the perturbed outputs adds ~ulp(out)/step ~ 1e-5 per output
// that moves. The largest error seen is 8e-5 (LayerNorm dinp): ~6x margin, while a
// wrong term (an O(0.1) error) still fails by orders of magnitude.
constexpr double kFp32Step = 1e-2;
constexpr Tolerance kFp32GradTolerance{5e-4, 5e-4};
// Central differences of a double reference with step kDoubleStep: truncation ~1e-12 and
// rounding ~1e-10, so what is left is the fp32 rounding of the analytic backward itself
// (largest seen 1.5e-7).
constexpr double kDoubleStep = 1e-6;
constexpr Tolerance kDoubleGradTolerance{1e-6, 1e-5};
// Bit-identical: exact arithmetic on small integers, or the very same fp32 operation.
constexpr Tolerance kExact{0.0, 0.0};
// AdamW against a hand-computed step: a dozen fp32 roundings of O(1) values.
constexpr Tolerance kAdamWTolerance{1e-6, 1e-6};

constexpr int kBatch = 2;
constexpr int kSeq = 5;
constexpr int kChannels = 8;
constexpr int kHeads = 2;
constexpr int kVocab = 11;
constexpr int kRows = kBatch * kSeq;

inline std::vector<int32_t> random_ints(size_t elems, uint64_t seed, int32_t bound) {
  Rng rng(seed);
  std::vector<int32_t> values(elems);
  for (int32_t& value : values) value = static_cast<int32_t>(rng.next() % bound);
  return values;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& values) {
  return std::vector<double>(values.begin(), values.end());
}

template <class Real>
double weighted_sum(const std::vector<Real>& out, const std::vector<float>& weights) {
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i) total += static_cast<double>(out[i]) * weights[i];
  return total;
}

// dL/dx by central differences, perturbing x (fp32 or double) in place. The denominator
// is the step the arithmetic actually took, not the one that was asked for.
template <class Real, class Objective>
std::vector<double> central_differences(std::vector<Real>& x, Objective objective) {
  std::vector<double> gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const Real original = x[i];
    const Real step = std::is_same_v<Real, float>
                          ? static_cast<Real>(kFp32Step) * std::max(Real{1}, std::fabs(original))
                          : static_cast<Real>(kDoubleStep);
    const Real plus = original + step, minus = original - step;
    x[i] = plus;
    const double up = objective();
    x[i] = minus;
    const double down = objective();
    x[i] = original;
    gradient[i] = (up - down) / (static_cast<double>(plus) - static_cast<double>(minus));
  }
  return gradient;
}

// What a backward added on top of the random prior in its output buffer, against the
// central differences of objective with respect to x.
template <class Real, class Objective>
::testing::AssertionResult gradient_matches(const std::string& what,
                                            const std::vector<float>& after,
                                            const std::vector<float>& prior, std::vector<Real>& x,
                                            Objective objective, Tolerance tolerance) {
  std::vector<double> added(after.size());
  for (size_t i = 0; i < after.size(); ++i) added[i] = double{after[i]} - double{prior[i]};
  return all_close(what, added, central_differences(x, objective), tolerance);
}

}  // namespace scalestudy::cpu_ops_test
