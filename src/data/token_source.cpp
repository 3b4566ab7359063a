#include "data/token_source.h"

#include "core/usage_error.h"
#include "data/markov_source.h"
#include "data/random_tokens.h"
#include "data/token_file.h"

namespace scalestudy {

std::unique_ptr<TokenSource> make_token_source(const std::string& kind, int vocab,
                                               uint64_t seed, const std::string& token_file) {
  if (kind != "random" && kind != "markov" && kind != "file") {
    throw UsageError("--data: unknown source '" + kind + "' (expected random, markov or file)");
  }
  // A token file given with a synthetic source would be silently ignored, and the run
  // would train on data the user did not ask for.
  if (kind != "file" && !token_file.empty()) {
    throw UsageError("--token-file " + token_file + " is only read with --data=file, not --data=" +
                     kind);
  }
  if (kind == "random") return std::make_unique<RandomTokens>(vocab, seed);
  if (kind == "markov") return std::make_unique<MarkovSource>(vocab, seed);
  if (token_file.empty()) throw UsageError("--data=file needs --token-file");
  return std::make_unique<TokenFileSource>(token_file, vocab);
}

}  // namespace scalestudy
