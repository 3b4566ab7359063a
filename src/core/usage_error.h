#pragma once
#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace scalestudy {

// Bad input from the user: an option, a value, a combination or a file. The command line
// turns it into one line on stderr and exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kUsageExitCode = 2;

// `text` on one line, as a usage error is printed: each control character (a newline in a
// value, an escape sequence) written as \xNN.
inline std::string one_line(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (!std::iscntrl(static_cast<unsigned char>(ch))) {
      out += ch;
      continue;
    }
    char escaped[8];
    std::snprintf(escaped, sizeof(escaped), "\\x%02x", static_cast<unsigned char>(ch));
    out += escaped;
  }
  return out;
}

}  // namespace scalestudy
