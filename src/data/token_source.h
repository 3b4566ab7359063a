#pragma once
// Where training tokens come from. A source is a pure function of the global sample
// index: sample g of the run is the same whatever the world size, and ranks that take
// disjoint index ranges never overlap. Step s with global batch B covers the samples
// [s*B, (s+1)*B); rank r of N takes the contiguous slice [r*B/N, (r+1)*B/N) of it.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace scalestudy {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // One line for logs and result files, e.g. "markov(vocab=64, seed=1)".
  virtual std::string describe() const = 0;
  // Every token the source produces is below this.
  virtual int vocab_size() const = 0;
  // Writes seq inputs and the seq next-token targets of sample sample_index.
  virtual void fill_sample(int64_t sample_index, int seq, int32_t* inputs,
                           int32_t* targets) const = 0;
  // The exact entropy rate in nats per token, where the source knows it.
  virtual std::optional<double> entropy_rate_nats() const { return std::nullopt; }
  // Throws UsageError where the source cannot give a sample of seq tokens (a token file
  // too short), so that the run is refused before it starts rather than at its first step.
  virtual void check_holds_sample(int /*seq*/) const {}
};

// The one place that turns the --data choice into a TokenSource. kind is "random",
// "markov" or "file"; token_file is read only (and required) for "file". Throws
// UsageError naming --data or --token-file when the combination is wrong.
std::unique_ptr<TokenSource> make_token_source(const std::string& kind, int vocab,
                                               uint64_t seed, const std::string& token_file);

}  // namespace scalestudy
