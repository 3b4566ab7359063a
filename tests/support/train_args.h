#pragma once
// Train options for a test, parsed as the command line parses them: the test fails when
// they do not parse.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/run_config.h"

namespace scalestudy {

// `options` are what follows "train" on the command line.
inline RunConfig parse_train_options(const std::vector<std::string>& options) {
  std::vector<const char*> argv = {"train"};
  for (const std::string& option : options) argv.push_back(option.c_str());
  RunConfig config;
  EXPECT_TRUE(parse_train_config(static_cast<int>(argv.size()), argv.data(), config));
  return config;
}

}  // namespace scalestudy
