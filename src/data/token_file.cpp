#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include "core/usage_error.h"

namespace scalestudy {

namespace {

// Both formats are little-endian on disk; assembling bytes keeps the reader correct on
// any host and free of alignment and aliasing questions, and compiles to plain loads.
uint64_t read_le(const unsigned char* bytes, int width_bytes) {
  uint64_t value = 0;
  for (int b = width_bytes - 1; b >= 0; --b) value = (value << 8) | bytes[b];
  return value;
}

void append_le(std::vector<unsigned char>& out, uint64_t value, int width_bytes) {
  for (int b = 0; b < width_bytes; ++b) out.push_back(static_cast<unsigned char>(value >> (8 * b)));
}

std::string hex_prefix(const unsigned char* bytes, size_t count) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text = "0x";
  for (size_t i = 0; i < count; ++i) {
    text += kDigits[bytes[i] >> 4];
    text += kDigits[bytes[i] & 0xf];
  }
  return text;
}

}  // namespace

TokenFileSource::TokenFileSource(const std::string& path, int vocab)
    : path_(path), vocab_(vocab) {
  if (vocab < 1) {
    throw UsageError("--token-file " + path + ": vocab size must be at least 1, got " +
                     std::to_string(vocab));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw UsageError("--token-file " + path + ": cannot open: " + std::strerror(errno));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int saved_errno = errno;
    ::close(fd);
    throw UsageError("--token-file " + path + ": cannot stat: " + std::strerror(saved_errno));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw UsageError("--token-file " + path + ": not a regular file");
  }
  file_bytes_ = static_cast<size_t>(info.st_size);
  if (file_bytes_ == 0) {
    ::close(fd);
    throw UsageError("--token-file " + path + ": is empty, so it has no header");
  }
  void* mapping = ::mmap(nullptr, file_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int saved_errno = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) {
    throw UsageError("--token-file " + path + ": cannot map: " + std::strerror(saved_errno));
  }
  mapping_ = mapping;
  try {
    parse_header();
    check_tokens();
  } catch (...) {
    ::munmap(mapping_, file_bytes_);
    throw;
  }
}

TokenFileSource::~TokenFileSource() {
  if (mapping_ != nullptr) ::munmap(mapping_, file_bytes_);
}

void TokenFileSource::parse_header() {
  const auto* bytes = static_cast<const unsigned char*>(mapping_);
  const std::string where = "--token-file " + path_ + ": ";
  size_t header_bytes = 0;
  // Every field of a header is read only once the whole header is known to be there.
  const auto require_header = [&](size_t bytes_needed, const std::string& header) {
    if (file_bytes_ < bytes_needed) {
      throw UsageError(where + "truncated: " + std::to_string(file_bytes_) + " bytes, shorter than the " +
                       std::to_string(bytes_needed) + "-byte " + header);
    }
  };
  if (file_bytes_ >= sizeof kTokenFileMagic &&
      std::memcmp(bytes, kTokenFileMagic, sizeof kTokenFileMagic) == 0) {
    format_ = TokenFileFormat::kScalestudy;
    header_bytes = kTokenFileHeaderBytes;
    require_header(header_bytes, "header");
    const uint64_t version = read_le(bytes + 8, 4);
    if (version != kTokenFileVersion) {
      throw UsageError(where + "unsupported version " + std::to_string(version) +
                       " (this build reads version " + std::to_string(kTokenFileVersion) + ")");
    }
    const uint64_t width = read_le(bytes + 12, 4);
    if (width != 2 && width != 4) {
      throw UsageError(where + "unsupported token width " + std::to_string(width) +
                       " bytes (expected 2 or 4)");
    }
    token_bytes_ = static_cast<int>(width);
    const uint64_t count = read_le(bytes + 16, 8);
    if (count > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw UsageError(where + "header token count " + std::to_string(count) + " is not plausible");
    }
    token_count_ = static_cast<int64_t>(count);
  } else if (file_bytes_ >= sizeof(int32_t) &&
             static_cast<int32_t>(read_le(bytes, 4)) == kLlmcShardMagic) {
    format_ = TokenFileFormat::kLlmc;
    header_bytes = kLlmcShardHeaderBytes;
    require_header(header_bytes, "llm.c shard header");
    const auto version = static_cast<int32_t>(read_le(bytes + 4, 4));
    if (version != kLlmcShardVersion) {
      throw UsageError(where + "unsupported llm.c shard version " + std::to_string(version) +
                       " (this build reads version " + std::to_string(kLlmcShardVersion) +
                       ", uint16 tokens)");
    }
    const auto count = static_cast<int32_t>(read_le(bytes + 8, 4));
    if (count < 0) {
      throw UsageError(where + "negative token count " + std::to_string(count) + " in header");
    }
    token_bytes_ = 2;
    token_count_ = count;
  } else {
    const size_t shown = std::min<size_t>(file_bytes_, sizeof kTokenFileMagic);
    if (shown < sizeof kTokenFileMagic && std::memcmp(bytes, kTokenFileMagic, shown) == 0) {
      throw UsageError(where + "truncated: " + std::to_string(file_bytes_) +
                       " bytes, shorter than the header");
    }
    throw UsageError(where + "unknown magic " + hex_prefix(bytes, shown) +
                     " (expected \"SSTOKENS\" or the llm.c shard magic " +
                     std::to_string(kLlmcShardMagic) + ")");
  }

  const uint64_t payload_bytes = file_bytes_ - header_bytes;
  const auto width = static_cast<uint64_t>(token_bytes_);
  const auto count = static_cast<uint64_t>(token_count_);
  // Compared by division so that a corrupt count cannot overflow the product.
  if (count > payload_bytes / width) {
    throw UsageError(where + "truncated: header says " + std::to_string(count) +
                     " tokens but only " + std::to_string(payload_bytes / width) +
                     " fit in the file");
  }
  if (payload_bytes != count * width) {
    throw UsageError(where + std::to_string(payload_bytes - count * width) +
                     " bytes follow the " + std::to_string(count) +
                     " tokens the header announces; the count or the file is corrupt");
  }
  tokens_ = bytes + header_bytes;
}

void TokenFileSource::check_tokens() const {
  const auto limit = static_cast<uint64_t>(vocab_);
  for (int64_t position = 0; position < token_count_; ++position) {
    const uint64_t value = read_le(tokens_ + position * token_bytes_, token_bytes_);
    if (value >= limit) {
      throw UsageError("--token-file " + path_ + ": token at position " +
                       std::to_string(position) + " is " + std::to_string(value) +
                       ", not below the vocab size " + std::to_string(vocab_));
    }
  }
}

int32_t TokenFileSource::token(int64_t position) const {
  return static_cast<int32_t>(read_le(tokens_ + position * token_bytes_, token_bytes_));
}

std::string TokenFileSource::describe() const {
  const char* format = format_ == TokenFileFormat::kScalestudy ? "scalestudy-v1" : "llm.c-v1";
  return "file(path=" + path_ + ", format=" + format + ", token_bytes=" +
         std::to_string(token_bytes_) + ", tokens=" + std::to_string(token_count_) +
         ", vocab=" + std::to_string(vocab_) + ")";
}

int64_t TokenFileSource::samples_per_epoch(int seq) const {
  if (seq < 1) {
    throw UsageError("--token-file " + path_ + ": sequence length must be at least 1, got " +
                     std::to_string(seq));
  }
  if (token_count_ < static_cast<int64_t>(seq) + 1) {
    throw UsageError("--token-file " + path_ + ": holds " + std::to_string(token_count_) +
                     " tokens, fewer than the seq + 1 = " + std::to_string(seq + 1) +
                     " one sample needs");
  }
  // Windows overlap by exactly one token (the last target of one is the first input of
  // the next), so every token is an input once per epoch.
  return (token_count_ - 1) / seq;
}

void TokenFileSource::fill_sample(int64_t sample_index, int seq, int32_t* inputs,
                                  int32_t* targets) const {
  const int64_t windows = samples_per_epoch(seq);
  const int64_t window = ((sample_index % windows) + windows) % windows;
  const int64_t start = window * seq;
  for (int t = 0; t < seq; ++t) {
    inputs[t] = token(start + t);
    targets[t] = token(start + t + 1);
  }
}

void write_token_file(const std::string& path, std::span<const int32_t> tokens,
                      int token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) {
    throw UsageError("token file " + path + ": cannot write token width " +
                     std::to_string(token_bytes) + " bytes (expected 2 or 4)");
  }
  const int64_t limit = token_bytes == 2 ? int64_t{1} << 16 : int64_t{1} << 32;
  std::vector<unsigned char> bytes;
  bytes.reserve(kTokenFileHeaderBytes + tokens.size() * static_cast<size_t>(token_bytes));
  bytes.insert(bytes.end(), kTokenFileMagic, kTokenFileMagic + sizeof kTokenFileMagic);
  append_le(bytes, kTokenFileVersion, 4);
  append_le(bytes, static_cast<uint64_t>(token_bytes), 4);
  append_le(bytes, tokens.size(), 8);
  bytes.resize(kTokenFileHeaderBytes, 0);
  for (size_t position = 0; position < tokens.size(); ++position) {
    const int64_t value = tokens[position];
    if (value < 0 || value >= limit) {
      throw UsageError("token file " + path + ": token at position " +
                       std::to_string(position) + " is " + std::to_string(value) +
                       ", which does not fit in " + std::to_string(token_bytes) + " bytes");
    }
    append_le(bytes, static_cast<uint64_t>(value), token_bytes);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw UsageError("token file " + path + ": cannot create: " + std::strerror(errno));
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw UsageError("token file " + path + ": cannot write: " + std::strerror(errno));
}

}  // namespace scalestudy
