// Training-data sources: every source is a pure function of the global sample index, the
// Markov source's stationary distribution and entropy rate are exact, and token files are
// read back bit for bit with a clear error for every kind of bad file; and the trainer's
// micro-batches read from a source: whatever it read ahead, load(step, m) gives exactly the
// samples that step and micro-batch cover on this rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/usage_error.h"
#include "data/markov_source.h"
#include "data/random_tokens.h"
#include "data/token_file.h"
#include "data/token_source.h"
#include "scratch_folder.h"
#include "train/micro_batch_loader.h"

namespace scalestudy {
namespace {

struct Sample {
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
  bool operator==(const Sample&) const = default;
};

Sample fetch(const TokenSource& source, int64_t index, int seq) {
  Sample sample{std::vector<int32_t>(static_cast<size_t>(seq)),
                std::vector<int32_t>(static_cast<size_t>(seq))};
  source.fill_sample(index, seq, sample.inputs.data(), sample.targets.data());
  return sample;
}

// Runs statement, expecting a one-line UsageError that contains every fragment.
void expect_usage_error(const std::function<void()>& statement,
                        std::initializer_list<std::string> fragments) {
  try {
    statement();
    ADD_FAILURE() << "expected a UsageError";
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message \"" << message << "\" lacks \"" << fragment << "\"";
    }
  }
}

// The properties every source owes the trainer, whatever its kind.
void check_source_contract(const TokenSource& source, int seq) {
  const int vocab = source.vocab_size();
  EXPECT_EQ(fetch(source, 7, seq), fetch(source, 7, seq)) << source.describe();
  EXPECT_NE(fetch(source, 0, seq), fetch(source, 1, seq)) << source.describe();

  for (int64_t index = 0; index < 16; ++index) {
    const Sample sample = fetch(source, index, seq);
    for (int t = 0; t < seq; ++t) {
      ASSERT_GE(sample.inputs[t], 0);
      ASSERT_LT(sample.inputs[t], vocab);
      ASSERT_GE(sample.targets[t], 0);
      ASSERT_LT(sample.targets[t], vocab);
      if (t + 1 < seq) {
        ASSERT_EQ(sample.targets[t], sample.inputs[t + 1]) << "t=" << t;
      }
    }
  }

  // Steps of a global batch of 12 split over 1..4 ranks, each rank fetching its slice
  // (ranks visited in reverse, to catch any hidden state): the same samples as one rank.
  const int64_t global_batch = 12;
  std::vector<Sample> single_rank;
  for (int64_t index = 0; index < 2 * global_batch; ++index) {
    single_rank.push_back(fetch(source, index, seq));
  }
  for (int64_t ranks = 1; ranks <= 4; ++ranks) {
    std::vector<Sample> split(single_rank.size());
    for (int64_t step = 0; step < 2; ++step) {
      for (int64_t rank = ranks - 1; rank >= 0; --rank) {
        for (int64_t index = step * global_batch + rank * global_batch / ranks;
             index < step * global_batch + (rank + 1) * global_batch / ranks; ++index) {
          split[static_cast<size_t>(index)] = fetch(source, index, seq);
        }
      }
    }
    EXPECT_EQ(split, single_rank) << "ranks=" << ranks;
  }
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_le(std::vector<unsigned char>& bytes, size_t offset, uint64_t value, int width) {
  for (int b = 0; b < width; ++b) bytes[offset + b] = static_cast<unsigned char>(value >> (8 * b));
}

// An llm.c shard as dev/data/data_common.py writes it: 256 int32 header, uint16 tokens.
std::vector<unsigned char> llmc_shard(const std::vector<int32_t>& tokens, int32_t magic,
                                      int32_t version, int32_t header_count) {
  std::vector<unsigned char> bytes(kLlmcShardHeaderBytes + 2 * tokens.size(), 0);
  put_le(bytes, 0, static_cast<uint32_t>(magic), 4);
  put_le(bytes, 4, static_cast<uint32_t>(version), 4);
  put_le(bytes, 8, static_cast<uint32_t>(header_count), 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    put_le(bytes, kLlmcShardHeaderBytes + 2 * i, static_cast<uint64_t>(tokens[i]), 2);
  }
  return bytes;
}

std::vector<int32_t> ramp_tokens(int64_t count_elems, int vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(count_elems));
  for (int64_t i = 0; i < count_elems; ++i) {
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % vocab);
  }
  return tokens;
}

// ---- random -------------------------------------------------------------------------

TEST(RandomTokens, Contract) {
  RandomTokens source(1000, 42);
  check_source_contract(source, 64);
  EXPECT_EQ(fetch(RandomTokens(1000, 42), 5, 64), fetch(source, 5, 64));
  EXPECT_NE(fetch(RandomTokens(1000, 43), 5, 64), fetch(source, 5, 64));
  EXPECT_DOUBLE_EQ(*source.entropy_rate_nats(), std::log(1000.0));
}

TEST(RandomTokens, CountsAreUniform) {
  const int vocab = 16;
  const int seq = 512;
  const int samples = 200;
  RandomTokens source(vocab, 3);
  std::vector<int64_t> counts(vocab, 0);
  for (int g = 0; g < samples; ++g) {
    for (int32_t token : fetch(source, g, seq).inputs) ++counts[static_cast<size_t>(token)];
  }
  const double expected = static_cast<double>(samples) * seq / vocab;
  const double sigma = std::sqrt(expected * (1.0 - 1.0 / vocab));
  for (int token = 0; token < vocab; ++token) {
    EXPECT_NEAR(static_cast<double>(counts[static_cast<size_t>(token)]), expected, 6 * sigma)
        << "token " << token;
  }
}

// ---- markov -------------------------------------------------------------------------

TEST(MarkovSource, Contract) {
  MarkovSource source(64, 1);
  check_source_contract(source, 64);
  EXPECT_EQ(fetch(MarkovSource(64, 1), 9, 64), fetch(source, 9, 64));
  EXPECT_NE(fetch(MarkovSource(64, 2), 9, 64), fetch(source, 9, 64));
}

TEST(MarkovSource, StationaryDistributionIsExact) {
  const int vocab = 64;
  MarkovSource source(vocab, 1);
  const std::vector<double>& pi = source.stationary();
  ASSERT_EQ(pi.size(), static_cast<size_t>(vocab));
  double total = 0.0;
  for (double p : pi) total += p;
  EXPECT_NEAR(total, 1.0, 1e-12);

  for (int from = 0; from < vocab; ++from) {
    double row_total = 0.0;
    for (int to = 0; to < vocab; ++to) row_total += source.transition_probability(from, to);
    EXPECT_NEAR(row_total, 1.0, 1e-12) << "row " << from;
  }
  for (int to = 0; to < vocab; ++to) {
    double flow_in = 0.0;
    for (int from = 0; from < vocab; ++from) {
      flow_in += pi[static_cast<size_t>(from)] * source.transition_probability(from, to);
    }
    EXPECT_NEAR(flow_in, pi[static_cast<size_t>(to)], 1e-12) << "state " << to;
  }
}

TEST(MarkovSource, EntropyRateMatchesDenseFormulaAndIsWellBelowLnV) {
  const int vocab = 64;
  MarkovSource source(vocab, 1);
  double dense_rate = 0.0;
  for (int from = 0; from < vocab; ++from) {
    for (int to = 0; to < vocab; ++to) {
      const double p = source.transition_probability(from, to);
      if (p > 0.0) dense_rate -= source.stationary()[static_cast<size_t>(from)] * p * std::log(p);
    }
  }
  const double rate = *source.entropy_rate_nats();
  EXPECT_NEAR(rate, dense_rate, 1e-12);
  // Well below ln V (a model can learn something) but far from 0 (not a lookup table).
  EXPECT_LT(rate, 0.6 * std::log(vocab));
  EXPECT_GT(rate, 0.2 * std::log(vocab));
}

// The plug-in entropy of the transition counts of a long sampled stream converges to the
// entropy rate; its bias is about -V(V-1)/(2n) = -0.002 nats here, and the statistical
// error is smaller still, so 2% is a loose bound that still catches a wrong sampler.
TEST(MarkovSource, EntropyRateMatchesLongSample) {
  const int vocab = 64;
  const int seq = 1024;
  const int samples = 1000;
  MarkovSource source(vocab, 5);
  std::vector<int64_t> pair_counts(static_cast<size_t>(vocab) * vocab, 0);
  std::vector<int64_t> state_counts(vocab, 0);
  for (int g = 0; g < samples; ++g) {
    const Sample sample = fetch(source, g, seq);
    for (int t = 0; t < seq; ++t) {
      ++pair_counts[static_cast<size_t>(sample.inputs[t]) * vocab + sample.targets[t]];
      ++state_counts[static_cast<size_t>(sample.inputs[t])];
    }
  }
  const double transitions = static_cast<double>(samples) * seq;
  double plug_in = 0.0;
  for (int from = 0; from < vocab; ++from) {
    for (int to = 0; to < vocab; ++to) {
      const auto count = static_cast<double>(pair_counts[static_cast<size_t>(from) * vocab + to]);
      if (count > 0) {
        plug_in -= count / transitions *
                   std::log(count / static_cast<double>(state_counts[static_cast<size_t>(from)]));
      }
    }
  }
  const double rate = *source.entropy_rate_nats();
  EXPECT_NEAR(plug_in, rate, 0.02 * rate);
  // State frequencies against pi: sigma is about 2e-4 per state, so 3e-3 is > 10 sigma.
  for (int state = 0; state < vocab; ++state) {
    EXPECT_NEAR(static_cast<double>(state_counts[static_cast<size_t>(state)]) / transitions,
                source.stationary()[static_cast<size_t>(state)], 3e-3)
        << "state " << state;
  }
}

TEST(MarkovSource, TwoStateChainHasClosedForm) {
  const double a = 0.3;  // P(0 -> 1)
  const double b = 0.1;  // P(1 -> 0)
  MarkovSource source({1 - a, a, b, 1 - b}, 2, 11);
  const auto binary_entropy = [](double p) { return -p * std::log(p) - (1 - p) * std::log(1 - p); };
  const double pi0 = b / (a + b);
  const double pi1 = a / (a + b);
  EXPECT_NEAR(source.stationary()[0], pi0, 1e-12);
  EXPECT_NEAR(source.stationary()[1], pi1, 1e-12);
  EXPECT_NEAR(*source.entropy_rate_nats(), pi0 * binary_entropy(a) + pi1 * binary_entropy(b),
              1e-12);
  check_source_contract(source, 64);
}

// Plain power iteration oscillates forever on a periodic chain; the source must still
// find its stationary distribution.
TEST(MarkovSource, PeriodicChainConvergesAndAlternates) {
  MarkovSource source({0, 1, 1, 0}, 2, 11);
  EXPECT_NEAR(source.stationary()[0], 0.5, 1e-12);
  EXPECT_NEAR(*source.entropy_rate_nats(), 0.0, 1e-15);
  const Sample sample = fetch(source, 3, 16);
  for (int t = 0; t < 16; ++t) EXPECT_EQ(sample.targets[t], 1 - sample.inputs[t]);
}

TEST(MarkovSource, GptSizedVocabularyStaysSparse) {
  MarkovSource source(50257, 1);
  double total = 0.0;
  for (double p : source.stationary()) total += p;
  EXPECT_NEAR(total, 1.0, 1e-12);
  EXPECT_LT(*source.entropy_rate_nats(), 0.5 * std::log(50257.0));
  check_source_contract(source, 32);
}

TEST(MarkovSource, RejectsBadParameters) {
  expect_usage_error([] { MarkovSource(1, 0); }, {"markov", "vocab"});
  expect_usage_error([] { MarkovSource(8, 0, {.likely_per_row = 0}); }, {"likely_per_row"});
  expect_usage_error([] { MarkovSource(8, 0, {.likely_mass = 1.0}); }, {"likely_mass"});
  expect_usage_error([] { MarkovSource({0.5, 0.4, 0.5, 0.5}, 2, 0); }, {"row 0", "sums to"});
  expect_usage_error([] { MarkovSource({1.5, -0.5, 0.5, 0.5}, 2, 0); }, {"(0, 1)"});
  expect_usage_error([] { MarkovSource({1.0, 0.0, 1.0}, 2, 0); }, {"3 entries"});
}

// ---- token files --------------------------------------------------------------------

using TokenFile = ScratchFolder;

TEST_F(TokenFile, RoundTripBothWidths) {
  for (int token_bytes : {2, 4}) {
    const int vocab = token_bytes == 2 ? 50257 : 100000;
    const std::string file = path("ramp" + std::to_string(token_bytes) + ".bin");
    const std::vector<int32_t> tokens = ramp_tokens(1000, vocab);
    write_token_file(file, tokens, token_bytes);
    EXPECT_EQ(read_bytes(file).size(), kTokenFileHeaderBytes + tokens.size() * token_bytes);

    TokenFileSource source(file, vocab);
    EXPECT_EQ(source.format(), TokenFileFormat::kScalestudy);
    EXPECT_EQ(source.token_bytes(), token_bytes);
    ASSERT_EQ(source.token_count(), 1000);
    for (int64_t i = 0; i < source.token_count(); ++i) {
      ASSERT_EQ(source.token(i), tokens[static_cast<size_t>(i)]) << "position " << i;
    }
    check_source_contract(source, 16);
  }
}

TEST_F(TokenFile, WindowsAreDisjointUntilTheFileWraps) {
  const std::string file = path("windows.bin");
  const std::vector<int32_t> tokens = ramp_tokens(103, 1000);
  write_token_file(file, tokens, 2);
  TokenFileSource source(file, 1000);
  const int seq = 10;
  ASSERT_EQ(source.samples_per_epoch(seq), 10);  // (103 - 1) / 10
  for (int64_t g = 0; g < 10; ++g) {
    const Sample sample = fetch(source, g, seq);
    for (int t = 0; t < seq; ++t) {
      ASSERT_EQ(sample.inputs[t], tokens[static_cast<size_t>(g * seq + t)]);
      ASSERT_EQ(sample.targets[t], tokens[static_cast<size_t>(g * seq + t + 1)]);
    }
  }
  EXPECT_EQ(fetch(source, 10, seq), fetch(source, 0, seq));
  EXPECT_EQ(fetch(source, 23, seq), fetch(source, 3, seq));
  // Exactly seq + 1 tokens: one window, every sample the same.
  write_token_file(file, std::vector<int32_t>(tokens.begin(), tokens.begin() + seq + 1), 2);
  TokenFileSource minimal(file, 1000);
  EXPECT_EQ(minimal.samples_per_epoch(seq), 1);
  EXPECT_EQ(fetch(minimal, 5, seq), fetch(minimal, 0, seq));
}

TEST_F(TokenFile, ReadsLlmcShard) {
  const std::string file = path("shard_000000.bin");
  const std::vector<int32_t> tokens = ramp_tokens(500, 50257);
  write_bytes(file, llmc_shard(tokens, kLlmcShardMagic, kLlmcShardVersion, 500));
  TokenFileSource source(file, 50257);
  EXPECT_EQ(source.format(), TokenFileFormat::kLlmc);
  EXPECT_EQ(source.token_bytes(), 2);
  ASSERT_EQ(source.token_count(), 500);
  for (int64_t i = 0; i < 500; ++i) ASSERT_EQ(source.token(i), tokens[static_cast<size_t>(i)]);
  EXPECT_NE(source.describe().find("llm.c"), std::string::npos);
  check_source_contract(source, 16);
}

TEST_F(TokenFile, BadFilesNameThePathAndTheProblem) {
  const std::vector<int32_t> tokens = ramp_tokens(100, 1000);
  const std::string good = path("good.bin");
  write_token_file(good, tokens, 2);
  const std::vector<unsigned char> good_bytes = read_bytes(good);

  const std::string missing = path("missing.bin");
  expect_usage_error([&] { TokenFileSource(missing, 1000); }, {missing, "cannot open"});

  const std::string empty = path("empty.bin");
  write_bytes(empty, {});
  expect_usage_error([&] { TokenFileSource(empty, 1000); }, {empty, "empty"});

  const std::string bad_magic = path("bad_magic.bin");
  std::vector<unsigned char> bytes = good_bytes;
  bytes[0] = 'X';
  write_bytes(bad_magic, bytes);
  expect_usage_error([&] { TokenFileSource(bad_magic, 1000); }, {bad_magic, "magic"});

  const std::string short_header = path("short_header.bin");
  write_bytes(short_header, std::vector<unsigned char>(good_bytes.begin(), good_bytes.begin() + 20));
  expect_usage_error([&] { TokenFileSource(short_header, 1000); }, {short_header, "truncated"});

  const std::string truncated = path("truncated.bin");
  write_bytes(truncated, std::vector<unsigned char>(good_bytes.begin(), good_bytes.end() - 3));
  expect_usage_error([&] { TokenFileSource(truncated, 1000); },
                     {truncated, "truncated", "100 tokens"});

  const std::string trailing = path("trailing.bin");
  bytes = good_bytes;
  bytes.push_back(0);
  write_bytes(trailing, bytes);
  expect_usage_error([&] { TokenFileSource(trailing, 1000); }, {trailing, "1 bytes follow"});

  const std::string bad_version = path("bad_version.bin");
  bytes = good_bytes;
  put_le(bytes, 8, 2, 4);
  write_bytes(bad_version, bytes);
  expect_usage_error([&] { TokenFileSource(bad_version, 1000); }, {bad_version, "version 2"});

  const std::string bad_width = path("bad_width.bin");
  bytes = good_bytes;
  put_le(bytes, 12, 3, 4);
  write_bytes(bad_width, bytes);
  expect_usage_error([&] { TokenFileSource(bad_width, 1000); }, {bad_width, "width 3"});

  const std::string too_big = path("too_big.bin");
  std::vector<int32_t> with_bad_token = tokens;
  with_bad_token[37] = 1000;
  with_bad_token[60] = 5000;
  write_token_file(too_big, with_bad_token, 2);
  expect_usage_error([&] { TokenFileSource(too_big, 1000); },
                     {too_big, "position 37", "is 1000", "vocab size 1000"});

  TokenFileSource source(good, 1000);
  expect_usage_error([&] { fetch(source, 0, 100); }, {good, "100 tokens", "101"});

  const std::string llmc_truncated = path("llmc_truncated.bin");
  write_bytes(llmc_truncated, llmc_shard(tokens, kLlmcShardMagic, kLlmcShardVersion, 101));
  expect_usage_error([&] { TokenFileSource(llmc_truncated, 1000); },
                     {llmc_truncated, "truncated", "101 tokens"});

  const std::string llmc_header = path("llmc_header.bin");
  bytes = llmc_shard(tokens, kLlmcShardMagic, kLlmcShardVersion, 100);
  bytes.resize(512);
  write_bytes(llmc_header, bytes);
  expect_usage_error([&] { TokenFileSource(llmc_header, 1000); }, {llmc_header, "truncated"});

  const std::string llmc_version = path("llmc_version.bin");
  write_bytes(llmc_version, llmc_shard(tokens, kLlmcShardMagic, 2, 100));
  expect_usage_error([&] { TokenFileSource(llmc_version, 1000); }, {llmc_version, "version 2"});

  expect_usage_error([&] { write_token_file(path("wide.bin"), std::vector<int32_t>{70000}, 2); },
                     {"wide.bin", "position 0", "70000"});
  expect_usage_error([&] { write_token_file(path("w3.bin"), tokens, 3); }, {"w3.bin", "width 3"});
}

// ---- make_token_source --------------------------------------------------------------

using MakeTokenSource = ScratchFolder;

TEST_F(MakeTokenSource, BuildsEachKind) {
  EXPECT_EQ(make_token_source("random", 100, 1, "")->describe().rfind("random(", 0), 0u);
  EXPECT_EQ(make_token_source("markov", 100, 1, "")->describe().rfind("markov(", 0), 0u);
  const std::string file = path("tokens.bin");
  write_token_file(file, ramp_tokens(100, 100), 2);
  const auto source = make_token_source("file", 100, 1, file);
  EXPECT_EQ(source->describe().rfind("file(", 0), 0u);
  EXPECT_EQ(source->vocab_size(), 100);
}

TEST_F(MakeTokenSource, RejectsBadCombinations) {
  expect_usage_error([] { make_token_source("shakespeare", 100, 1, ""); },
                     {"--data", "shakespeare"});
  expect_usage_error([] { make_token_source("file", 100, 1, ""); }, {"--data=file", "--token-file"});
  expect_usage_error([] { make_token_source("random", 100, 1, "x.bin"); }, {"--token-file", "x.bin"});
}

// The trainer's micro-batches on rank 1 of 2.
constexpr int kLoaderSeq = 8;
const MicroBatchShape kLoaderShape{/*rank=*/1, /*global_batch=*/8, /*batch_per_rank=*/4, /*micro_batch=*/2,
                                   kLoaderSeq};

// The samples of (step, micro_batch) straight from the source, inputs then targets.
std::vector<int32_t> source_samples(const TokenSource& source, int step, int micro_batch) {
  const int64_t first = int64_t{step} * kLoaderShape.global_batch +
                        int64_t{kLoaderShape.rank} * kLoaderShape.batch_per_rank +
                        int64_t{micro_batch} * kLoaderShape.micro_batch;
  const size_t elems = static_cast<size_t>(kLoaderShape.micro_batch) * kLoaderSeq;
  std::vector<int32_t> tokens(2 * elems);
  for (int i = 0; i < kLoaderShape.micro_batch; ++i)
    source.fill_sample(first + i, kLoaderSeq, tokens.data() + i * kLoaderSeq,
                       tokens.data() + elems + i * kLoaderSeq);
  return tokens;
}

// The micro-batch the loader holds, inputs then targets.
std::vector<int32_t> loaded_samples(const MicroBatchLoader& loader) {
  const size_t elems = static_cast<size_t>(kLoaderShape.micro_batch) * kLoaderSeq;
  std::vector<int32_t> tokens(loader.inputs(), loader.inputs() + elems);
  tokens.insert(tokens.end(), loader.targets(), loader.targets() + elems);
  return tokens;
}

TEST(MicroBatchLoader, GivesEachStepItsOwnSamplesWhateverWasReadAhead) {
  const RandomTokens source(50, 7);
  MicroBatchLoader loader(source, kLoaderShape);
  struct Load {
    int step, micro_batch, prefetch_after;  // prefetch_after: the step read ahead, -1 none
  };
  // In order with read-ahead, then a read-ahead that is not used (step 3 skipped), a
  // load of a step read ahead but of its second micro-batch, and one never read ahead.
  const std::vector<Load> loads = {{0, 0, -1}, {0, 1, 1}, {1, 0, -1}, {1, 1, 2}, {2, 0, -1},
                                   {2, 1, 3}, {4, 0, 5}, {5, 1, -1}, {5, 0, -1}, {3, 0, -1}};
  for (const Load& load : loads) {
    loader.load(load.step, load.micro_batch);
    EXPECT_EQ(loaded_samples(loader), source_samples(source, load.step, load.micro_batch))
        << "step " << load.step << ", micro-batch " << load.micro_batch;
    if (load.prefetch_after >= 0) loader.prefetch(load.prefetch_after);
  }
}

}  // namespace
}  // namespace scalestudy
