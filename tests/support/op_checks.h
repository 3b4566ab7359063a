#pragma once
// What the op tests of every backend share: seeded random inputs that are the same with
// every compiler and standard library, and the element-wise tolerance check that prints
// the first mismatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

namespace scalestudy::op_test {

// |got - ref| <= atol + rtol*|ref|, element by element.
struct Tolerance {
  double atol;
  double rtol;
};

// splitmix64: fixed across compilers and standard libraries, unlike std distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(next() >> 40) * 0x1.0p-24);
  }

 private:
  uint64_t state_;
};

inline std::vector<float> random_floats(size_t elems, uint64_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> values(elems);
  for (float& value : values) value = rng.uniform(lo, hi);
  return values;
}

// On success the message (see ::testing::AssertionResult::message) holds the largest
// |error| / (atol + rtol*|ref|): the fraction of the bound used, for reporting margins.
template <class Got, class Ref>
::testing::AssertionResult all_close(const std::string& what, const Got& got, const Ref& ref,
                                     Tolerance tolerance) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " vs " << ref.size()
                                         << " elements";
  size_t mismatches = 0, first = 0;
  double worst = 0.0, worst_fraction = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double error = std::fabs(g - r);
    const double bound = tolerance.atol + tolerance.rtol * std::fabs(r);
    if (!(error <= bound)) {
      if (mismatches++ == 0) first = i;
    }
    if (error > worst || std::isnan(error)) worst = error;
    if (bound > 0.0) worst_fraction = std::max(worst_fraction, error / bound);
  }
  if (mismatches == 0) return ::testing::AssertionSuccess() << worst_fraction;
  std::ostringstream text;
  text << std::setprecision(9) << what << ": " << mismatches << " of " << got.size()
       << " elements exceed atol " << tolerance.atol << " + rtol " << tolerance.rtol
       << "*|ref|; first at index " << first << ": got " << static_cast<double>(got[first])
       << ", ref " << static_cast<double>(ref[first]) << "; largest |error| " << worst;
  return ::testing::AssertionFailure() << text.str();
}

}  // namespace scalestudy::op_test
