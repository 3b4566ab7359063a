#pragma once
// A synthetic order-1 Markov source whose entropy rate is known exactly, so that a
// training run's loss can be compared with the best loss any model could reach.
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_source.h"

namespace scalestudy {

class SampleRng;

// Shape of the generated chain. Each row puts likely_mass on likely_per_row distinct
// successors (weights from a flat Dirichlet draw) and spreads the rest uniformly over the
// whole vocabulary. The uniform floor keeps the chain irreducible and aperiodic, so the
// stationary distribution is unique; the likely successors keep the entropy rate far
// below ln V (about 1.7 nats at V = 64 with the defaults, against ln 64 = 4.16).
struct MarkovOptions {
  int likely_per_row = 4;
  double likely_mass = 0.9;
};

class MarkovSource final : public TokenSource {
 public:
  // A chain generated from the seed; the same (vocab, seed, options) gives the same chain.
  MarkovSource(int vocab, uint64_t seed, MarkovOptions options = {});
  // A hand-made chain: transition is vocab x vocab, row-major, rows summing to 1. The
  // seed only drives sampling.
  MarkovSource(const std::vector<double>& transition, int vocab, uint64_t seed);

  std::string describe() const override;
  int vocab_size() const override { return vocab_; }
  void fill_sample(int64_t sample_index, int seq, int32_t* inputs,
                   int32_t* targets) const override;
  std::optional<double> entropy_rate_nats() const override { return entropy_rate_nats_; }

  // P(next = to | current = from).
  double transition_probability(int from, int to) const;
  const std::vector<double>& stationary() const { return stationary_; }

 private:
  // Rows are stored sparsely so that a GPT-2-sized vocabulary costs O(V * likely_per_row)
  // rather than V^2: P(i -> j) = floor_prob_per_token_ + (explicit weight of j in row i).
  void append_row(const std::vector<int32_t>& tokens, const std::vector<double>& weights);
  void compute_stationary();
  void compute_entropy_rate();
  int32_t next_token(int32_t current, SampleRng& rng) const;

  int vocab_;
  uint64_t seed_;
  std::string generator_;  // how the chain was made, for describe()
  double floor_mass_;      // probability of the uniform branch, the same in every row
  double floor_prob_per_token_;
  // Row i's explicit successors are row_tokens_[row_begin_[i] .. row_begin_[i+1]), with
  // running sums of their weights in row_cumulative_; the last running sum is the row's
  // explicit mass, 1 - floor_mass_.
  std::vector<int64_t> row_begin_;
  std::vector<int32_t> row_tokens_;
  std::vector<double> row_weights_;
  std::vector<double> row_cumulative_;
  std::vector<double> stationary_;
  std::vector<double> stationary_cumulative_;
  double entropy_rate_nats_ = 0.0;
};

}  // namespace scalestudy
