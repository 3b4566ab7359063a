#pragma once
// Training tokens read from a file: scalestudy's own format or an llm.c shard. Both are
// described, with the rule that maps sample indices to windows, in
// docs/token-file-format.md.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "data/token_source.h"

namespace scalestudy {

inline constexpr char kTokenFileMagic[8] = {'S', 'S', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderBytes = 32;

inline constexpr int32_t kLlmcShardMagic = 20240520;
inline constexpr int32_t kLlmcShardVersion = 1;
inline constexpr size_t kLlmcShardHeaderBytes = 256 * sizeof(int32_t);

enum class TokenFileFormat { kScalestudy, kLlmc };

class TokenFileSource final : public TokenSource {
 public:
  // Maps the file read-only, so that ranks sharing a node share its pages, and checks
  // every token against vocab up front: a bad token is reported once, by position,
  // instead of surfacing as an out-of-range embedding lookup mid-run.
  TokenFileSource(const std::string& path, int vocab);
  ~TokenFileSource() override;
  TokenFileSource(const TokenFileSource&) = delete;
  TokenFileSource& operator=(const TokenFileSource&) = delete;

  std::string describe() const override;
  int vocab_size() const override { return vocab_; }
  // Sample g is the window of seq + 1 tokens starting at (g mod samples_per_epoch) * seq.
  void fill_sample(int64_t sample_index, int seq, int32_t* inputs,
                   int32_t* targets) const override;

  // How many consecutive samples have disjoint inputs before the file wraps; throws
  // UsageError when the file holds fewer than seq + 1 tokens.
  int64_t samples_per_epoch(int seq) const;
  void check_holds_sample(int seq) const override { samples_per_epoch(seq); }
  int64_t token_count() const { return token_count_; }
  int token_bytes() const { return token_bytes_; }
  TokenFileFormat format() const { return format_; }
  int32_t token(int64_t position) const;

 private:
  void parse_header();
  void check_tokens() const;

  std::string path_;
  int vocab_;
  TokenFileFormat format_ = TokenFileFormat::kScalestudy;
  int token_bytes_ = 0;
  int64_t token_count_ = 0;
  void* mapping_ = nullptr;
  size_t file_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
};

// Writes tokens in scalestudy's format with token_bytes = 2 or 4. Throws UsageError when a
// token does not fit the width or the file cannot be written.
void write_token_file(const std::string& path, std::span<const int32_t> tokens,
                      int token_bytes);

}  // namespace scalestudy
