#include "data/random_tokens.h"

#include <cmath>

#include "core/usage_error.h"

namespace scalestudy {

namespace {

// Distinct per use, so that "random" and "markov" with one seed are unrelated streams.
constexpr uint64_t kRandomTokensDomain = 0x52414e44544f4b53ULL;  // "RANDTOKS"

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

SampleRng::SampleRng(uint64_t seed, uint64_t domain, uint64_t stream) {
  // Chaining the mixes (rather than xor-ing the inputs) keeps (seed, stream) and
  // (stream, seed) apart.
  uint64_t key = mix64(mix64(mix64(seed) ^ domain) ^ stream);
  for (uint64_t& word : state_) {
    key += 0x9e3779b97f4a7c15ULL;
    word = mix64(key);
  }
  // xoshiro's only bad state; splitmix output makes it practically impossible, but cheap.
  if ((state_[0] | state_[1] | state_[2] | state_[3]) == 0) state_[0] = 1;
}

uint64_t SampleRng::next_u64() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

uint32_t SampleRng::below(uint64_t bound) {
  // Lemire's multiply-shift with rejection: unbiased, and almost never loops.
  const uint32_t threshold = static_cast<uint32_t>((uint64_t{1} << 32) % bound);
  for (;;) {
    const uint64_t product = (next_u64() >> 32) * bound;
    if (static_cast<uint32_t>(product) >= threshold) return static_cast<uint32_t>(product >> 32);
  }
}

double SampleRng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

RandomTokens::RandomTokens(int vocab, uint64_t seed) : vocab_(vocab), seed_(seed) {
  if (vocab < 1) {
    throw UsageError("random token source: vocab size must be at least 1, got " +
                     std::to_string(vocab));
  }
}

std::string RandomTokens::describe() const {
  return "random(vocab=" + std::to_string(vocab_) + ", seed=" + std::to_string(seed_) + ")";
}

void check_sample_length(const std::string& source, int seq) {
  if (seq < 1) throw UsageError(source + ": sequence length must be at least 1, got " + std::to_string(seq));
}

void RandomTokens::fill_sample(int64_t sample_index, int seq, int32_t* inputs,
                               int32_t* targets) const {
  check_sample_length("random token source", seq);
  SampleRng rng(seed_, kRandomTokensDomain, static_cast<uint64_t>(sample_index));
  // Every token is drawn alone: the chain's step ignores the token before.
  const auto draw = [&](int32_t) { return static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_))); };
  write_token_chain(draw(0), seq, inputs, targets, draw);
}

std::optional<double> RandomTokens::entropy_rate_nats() const {
  return std::log(static_cast<double>(vocab_));
}

}  // namespace scalestudy
