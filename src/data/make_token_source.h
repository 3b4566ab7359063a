#pragma once
// The one place that turns the --data choice into a TokenSource.
#include <cstdint>
#include <memory>
#include <string>

#include "data/token_source.h"

namespace scalestudy {

// kind is "random", "markov" or "file"; token_file is read only (and required) for "file".
// Throws UsageError naming --data or --token-file when the combination is wrong.
std::unique_ptr<TokenSource> make_token_source(const std::string& kind, int vocab,
                                               uint64_t seed, const std::string& token_file);

}  // namespace scalestudy
