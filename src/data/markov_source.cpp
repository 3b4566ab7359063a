#include "data/markov_source.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/usage_error.h"
#include "data/random_tokens.h"

namespace scalestudy {

namespace {

// Separate streams for building the chain and for sampling from it, so that changing how
// rows are drawn never shifts the samples of an unrelated chain, and vice versa.
constexpr uint64_t kChainDomain = 0x4d41524b4f56544dULL;   // "MARKOVTM"
constexpr uint64_t kSampleDomain = 0x4d41524b4f56534dULL;  // "MARKOVSM"

// Residual (L1 norm of pi P - pi) at which the power iteration stops. The tests demand
// 1e-12 per entry; rounding in the sums sits near 1e-16 * likely_per_row.
constexpr double kStationaryTolerance = 1e-13;
constexpr int kMaxStationaryIterations = 100000;

// Tolerance on the row sums of a hand-made matrix: loose enough for decimal literals,
// tight enough to catch a row that was simply wrong.
constexpr double kRowSumTolerance = 1e-9;

std::string format_double(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return buffer;
}

}  // namespace

MarkovSource::MarkovSource(int vocab, uint64_t seed, MarkovOptions options)
    : vocab_(vocab), seed_(seed) {
  if (vocab < 2) {
    throw UsageError("markov source: vocab size must be at least 2, got " +
                     std::to_string(vocab));
  }
  if (options.likely_per_row < 1) {
    throw UsageError("markov source: likely_per_row must be at least 1, got " +
                     std::to_string(options.likely_per_row));
  }
  // A floor of zero could make the chain reducible or periodic, and then neither the
  // stationary distribution nor the entropy rate would be unique.
  if (!(options.likely_mass >= 0.0 && options.likely_mass < 1.0)) {
    throw UsageError("markov source: likely_mass must be in [0, 1), got " +
                     format_double(options.likely_mass));
  }
  // Small vocabularies (tests, toy runs) cannot hold more distinct successors than V.
  const int likely_per_row = std::min(options.likely_per_row, vocab);
  floor_mass_ = 1.0 - options.likely_mass;
  floor_prob_per_token_ = floor_mass_ / vocab;
  generator_ = "likely_per_row=" + std::to_string(likely_per_row) +
               ", likely_mass=" + format_double(options.likely_mass);

  row_begin_.reserve(static_cast<size_t>(vocab) + 1);
  row_begin_.push_back(0);
  std::vector<int32_t> tokens;
  std::vector<double> weights;
  for (int row = 0; row < vocab; ++row) {
    SampleRng rng(seed, kChainDomain, static_cast<uint64_t>(row));
    tokens.clear();
    weights.clear();
    while (static_cast<int>(tokens.size()) < likely_per_row) {
      const auto candidate = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
      if (std::find(tokens.begin(), tokens.end(), candidate) == tokens.end()) {
        tokens.push_back(candidate);
      }
    }
    // Normalised exponentials are a flat Dirichlet draw: some rows nearly deterministic,
    // some close to uniform over their successors, which gives the model varied contexts.
    double total = 0.0;
    for (int k = 0; k < likely_per_row; ++k) {
      weights.push_back(-std::log1p(-rng.uniform()));
      total += weights.back();
    }
    for (double& weight : weights) weight *= options.likely_mass / total;
    append_row(tokens, weights);
  }
  compute_stationary();
  compute_entropy_rate();
}

MarkovSource::MarkovSource(const std::vector<double>& transition, int vocab, uint64_t seed)
    : vocab_(vocab), seed_(seed), generator_("hand-made"), floor_mass_(0.0),
      floor_prob_per_token_(0.0) {
  if (vocab < 1) {
    throw UsageError("markov source: vocab size must be at least 1, got " +
                     std::to_string(vocab));
  }
  const auto vocab_elems = static_cast<size_t>(vocab);
  if (transition.size() != vocab_elems * vocab_elems) {
    throw UsageError("markov source: transition matrix has " +
                     std::to_string(transition.size()) + " entries, expected " +
                     std::to_string(vocab_elems * vocab_elems) + " for vocab " +
                     std::to_string(vocab));
  }
  row_begin_.reserve(vocab_elems + 1);
  row_begin_.push_back(0);
  std::vector<int32_t> tokens;
  std::vector<double> weights;
  for (int row = 0; row < vocab; ++row) {
    tokens.clear();
    weights.clear();
    double total = 0.0;
    for (int to = 0; to < vocab; ++to) {
      const double p = transition[static_cast<size_t>(row) * vocab_elems + to];
      if (!(std::isfinite(p) && p >= 0.0)) {
        throw UsageError("markov source: transition matrix entry (" + std::to_string(row) +
                         ", " + std::to_string(to) + ") is " + format_double(p) +
                         ", not a probability");
      }
      if (p > 0.0) {
        tokens.push_back(to);
        weights.push_back(p);
        total += p;
      }
    }
    if (std::abs(total - 1.0) > kRowSumTolerance) {
      throw UsageError("markov source: row " + std::to_string(row) +
                       " of the transition matrix sums to " + format_double(total) +
                       ", not 1");
    }
    for (double& weight : weights) weight /= total;
    append_row(tokens, weights);
    // Without a floor the explicit branch is always taken, so the running sum must reach
    // exactly 1 or a draw just below 1 could fall off the end of the row.
    row_cumulative_.back() = 1.0;
  }
  compute_stationary();
  compute_entropy_rate();
}

void MarkovSource::append_row(const std::vector<int32_t>& tokens,
                              const std::vector<double>& weights) {
  double running = 0.0;
  for (size_t k = 0; k < tokens.size(); ++k) {
    running += weights[k];
    row_tokens_.push_back(tokens[k]);
    row_weights_.push_back(weights[k]);
    row_cumulative_.push_back(running);
  }
  row_begin_.push_back(static_cast<int64_t>(row_tokens_.size()));
}

void MarkovSource::compute_stationary() {
  const auto vocab_elems = static_cast<size_t>(vocab_);
  // With a floor the chain is aperiodic and plain power iteration contracts by at least
  // 1 - floor_mass per step. A hand-made chain may be periodic (0 1 / 1 0), where plain
  // iteration oscillates forever; the lazy chain (I + P) / 2 has the same stationary
  // distribution and is always aperiodic.
  const double laziness = floor_mass_ > 0.0 ? 0.0 : 0.5;
  std::vector<double> pi(vocab_elems, 1.0 / vocab_);
  std::vector<double> next(vocab_elems);
  double residual = 0.0;
  int iteration = 0;
  for (; iteration < kMaxStationaryIterations; ++iteration) {
    std::fill(next.begin(), next.end(), floor_prob_per_token_);
    for (int row = 0; row < vocab_; ++row) {
      const double mass = pi[static_cast<size_t>(row)];
      for (int64_t k = row_begin_[row]; k < row_begin_[row + 1]; ++k) {
        next[static_cast<size_t>(row_tokens_[k])] += mass * row_weights_[k];
      }
    }
    double total = 0.0;
    for (size_t j = 0; j < vocab_elems; ++j) {
      next[j] = laziness * pi[j] + (1.0 - laziness) * next[j];
      total += next[j];
    }
    // Renormalising stops the rounding drift of the total from accumulating.
    residual = 0.0;
    for (size_t j = 0; j < vocab_elems; ++j) {
      next[j] /= total;
      residual += std::abs(next[j] - pi[j]);
    }
    pi.swap(next);
    if (residual / (1.0 - laziness) < kStationaryTolerance) break;
  }
  if (iteration == kMaxStationaryIterations) {
    throw UsageError("markov source: the stationary distribution did not converge in " +
                     std::to_string(kMaxStationaryIterations) + " iterations (residual " +
                     format_double(residual) + "); lower likely_mass");
  }
  stationary_ = std::move(pi);

  stationary_cumulative_.resize(vocab_elems);
  double running = 0.0;
  size_t last_positive = 0;
  for (size_t j = 0; j < vocab_elems; ++j) {
    running += stationary_[j];
    stationary_cumulative_[j] = running;
    if (stationary_[j] > 0.0) last_positive = j;
  }
  // A draw just below 1 must land on a state the chain can occupy, never on a trailing
  // transient state of zero mass.
  for (size_t j = last_positive; j < vocab_elems; ++j) stationary_cumulative_[j] = 1.0;
}

void MarkovSource::compute_entropy_rate() {
  double rate = 0.0;
  for (int row = 0; row < vocab_; ++row) {
    const int64_t explicit_elems = row_begin_[row + 1] - row_begin_[row];
    double row_entropy = 0.0;
    for (int64_t k = row_begin_[row]; k < row_begin_[row + 1]; ++k) {
      const double p = floor_prob_per_token_ + row_weights_[k];
      if (p > 0.0) row_entropy -= p * std::log(p);
    }
    if (floor_prob_per_token_ > 0.0) {
      row_entropy -= static_cast<double>(vocab_ - explicit_elems) * floor_prob_per_token_ *
                     std::log(floor_prob_per_token_);
    }
    rate += stationary_[static_cast<size_t>(row)] * row_entropy;
  }
  entropy_rate_nats_ = rate;
}

double MarkovSource::transition_probability(int from, int to) const {
  double p = floor_prob_per_token_;
  for (int64_t k = row_begin_[from]; k < row_begin_[from + 1]; ++k) {
    if (row_tokens_[k] == to) p += row_weights_[k];
  }
  return p;
}

std::string MarkovSource::describe() const {
  return "markov(vocab=" + std::to_string(vocab_) + ", seed=" + std::to_string(seed_) + ", " +
         generator_ + ", entropy_rate=" + format_double(entropy_rate_nats_) + " nats)";
}

int32_t MarkovSource::next_token(int32_t current, SampleRng& rng) const {
  const int64_t begin = row_begin_[current];
  const int64_t end = row_begin_[current + 1];
  const double u = rng.uniform();
  if (floor_mass_ == 0.0 || u < row_cumulative_[end - 1]) {
    const auto first = row_cumulative_.begin() + begin;
    const auto last = row_cumulative_.begin() + end;
    const int64_t k = std::min<int64_t>(std::upper_bound(first, last, u) - first,
                                        end - begin - 1);
    return row_tokens_[begin + k];
  }
  return static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_)));
}

void MarkovSource::fill_sample(int64_t sample_index, int seq, int32_t* inputs,
                               int32_t* targets) const {
  check_sample_length("markov source", seq);
  SampleRng rng(seed_, kSampleDomain, static_cast<uint64_t>(sample_index));
  // Starting in the stationary distribution makes every position of every sample
  // distributed alike, so the best achievable loss is the entropy rate at every position,
  // not only after a burn-in.
  const double u = rng.uniform();
  const auto first_state = std::upper_bound(stationary_cumulative_.begin(),
                                            stationary_cumulative_.end(), u) -
                           stationary_cumulative_.begin();
  const auto first = static_cast<int32_t>(std::min<int64_t>(first_state, vocab_ - 1));
  write_token_chain(first, seq, inputs, targets, [&](int32_t current) { return next_token(current, rng); });
}

}  // namespace scalestudy
