#pragma once
// Uniform random tokens, and the per-sample generator every synthetic source shares.
#include <cstdint>
#include <string>

#include "data/token_source.h"

namespace scalestudy {

// xoshiro256** seeded through splitmix64 from (seed, domain, stream). Each sample gets its
// own generator keyed by its global index, so sample g never depends on which samples
// were drawn before it on this rank: that is what makes the data independent of the
// world size. The domain keeps the streams of different uses of one seed apart.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t domain, uint64_t stream);

  uint64_t next_u64();
  // Uniform in [0, bound), without modulo bias; bound must be in [1, 2^32].
  uint32_t below(uint64_t bound);
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t state_[4];
};

// splitmix64's finaliser: a bijective 64-bit mix, good enough to decorrelate seeds.
uint64_t mix64(uint64_t x);

// Throws UsageError, naming `source`, for a sequence length below 1.
void check_sample_length(const std::string& source, int seq);

// Writes a chain of seq + 1 tokens, `first` and then each `next(previous)`, as a sample:
// its seq inputs and their seq next-token targets.
template <typename Next>
void write_token_chain(int32_t first, int seq, int32_t* inputs, int32_t* targets, Next next) {
  int32_t current = first;
  for (int t = 0; t < seq; ++t) {
    const int32_t following = next(current);
    inputs[t] = current;
    targets[t] = following;
    current = following;
  }
}

class RandomTokens final : public TokenSource {
 public:
  RandomTokens(int vocab, uint64_t seed);

  std::string describe() const override;
  int vocab_size() const override { return vocab_; }
  void fill_sample(int64_t sample_index, int seq, int32_t* inputs,
                   int32_t* targets) const override;
  // Every token is independent and uniform, so the rate is exactly ln V.
  std::optional<double> entropy_rate_nats() const override;

 private:
  int vocab_;
  uint64_t seed_;
};

}  // namespace scalestudy
