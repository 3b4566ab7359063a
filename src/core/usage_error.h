#pragma once
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

}  // namespace scalestudy
