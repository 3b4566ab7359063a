// Values that were once accepted silently, and paths and config files that were misread:
// each is refused with a UsageError that names the option (or the file and its line).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "core/usage_error.h"
#include "train_args.h"

namespace scalestudy {
namespace {

// The UsageError's message for these arguments; fails the test when there is none.
std::string refusal(const std::vector<std::string>& args) {
  try {
    parse_train_options(args);
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "accepted: " << testing::PrintToString(args);
  return "";
}

void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& fragments) {
  const std::string message = refusal(args);
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << message;
}

class ScratchFolder : public testing::Test {
 protected:
  void SetUp() override {
    folder_ = std::filesystem::temp_directory_path() /
              ("scalestudy-refusals-" + std::to_string(::getpid()) + "-" +
               testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(folder_);
  }
  void TearDown() override { std::filesystem::remove_all(folder_); }
  std::string write(const std::string& name, const std::string& content) {
    const std::filesystem::path path = folder_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path.string();
  }
  std::filesystem::path folder_;
};

TEST(ConfigRefusals, SentinelsAndNonFiniteNumbers) {
  expect_refused({"--global-batch", "0"}, {"--global-batch 0", "at least 1"});
  expect_refused({"--warmup-steps", "-1"}, {"--warmup-steps -1", "at least 0"});
  expect_refused({"--seed", "-1"}, {"--seed -1"});
  expect_refused({"--seed", "12x"}, {"--seed 12x"});
  for (const char* option : {"--lr", "--grad-clip", "--weight-decay", "--bucket-mb", "--comm-timeout", "--beta1"})
    for (const char* value : {"inf", "nan"}) expect_refused({option, value}, {std::string(option) + " " + value});
  EXPECT_EQ(parse_train_options({"--seed", "0"}).seed, 0u);
  EXPECT_EQ(parse_train_options({"--seed", "18446744073709551615"}).seed, 18446744073709551615ull);
}

TEST(ConfigRefusals, StrayArgumentsAndAbbreviations) {
  expect_refused({"--steps", "3", "stray"}, {"unexpected argument 'stray'"});
  expect_refused({"--outp", "x.h5"}, {"--outp"});
  expect_refused({"--strat", "ddp"}, {"--strat"});
}

TEST_F(ScratchFolder, OutputPaths) {
  expect_refused({"--output", ""}, {"--output", "empty"});
  expect_refused({"--output", folder_.string()}, {"--output " + folder_.string(), "is a directory"});
  const std::string existing = write("done.h5", "a result");
  expect_refused({"--output", existing}, {"--output " + existing, "--overwrite"});
  EXPECT_EQ(parse_train_options({"--output", existing, "--overwrite"}).output, existing);
  const std::string tokens = write("tokens.bin", "not really tokens");
  expect_refused({"--data", "file", "--token-file", tokens, "--output", tokens, "--overwrite"},
                 {"--output " + tokens, "--token-file"});
  const std::string config = write("run.ini", "steps = 3\n");
  expect_refused({"--config", config, "--output", config, "--overwrite"}, {"--output " + config, "--config"});
}

TEST_F(ScratchFolder, TokenFilesThatAreNoFiles) {
  expect_refused({"--data", "file", "--token-file", folder_.string()}, {"--token-file", "is a directory"});
  const std::string fifo = (folder_ / "tokens.fifo").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_refused({"--data", "file", "--token-file", fifo}, {"--token-file " + fifo, "not a regular file"});
  expect_refused({"--data", "file", "--token-file", (folder_ / "none.bin").string()}, {"no such file"});
}

TEST(ConfigRefusals, ProfileKernelsOnTheCpuNamesTheBackend) {
  expect_refused({"--profile-kernels"}, {"--profile-kernels", "--backend cuda"});
  expect_refused({"--nonfinite-loss", "ignore"}, {"--nonfinite-loss ignore", "stop or continue"});
}

TEST_F(ScratchFolder, ConfigFilesNameTheFileAndLine) {
  expect_refused({"--config", folder_.string()}, {"--config " + folder_.string(), "not a regular file"});
  expect_refused({"--config", (folder_ / "missing.ini").string()}, {"missing.ini", "no such file"});
  const std::string unknown = write("unknown.ini", "steps = 3\n\nbogus = 1\n");
  expect_refused({"--config", unknown}, {unknown + ":3", "bogus"});
  const std::string bad = write("bad.ini", "steps = abc\n");
  expect_refused({"--config", bad}, {bad + ":1", "steps"});
  const std::string nested = write("nested.ini", "steps = 3\nconfig = " + unknown + "\n");
  expect_refused({"--config", nested}, {nested + ":2", "config ="});
  const std::string binary = write("binary.ini", std::string("steps = 3\n\x7f" "ELF\x01\x02", 15));
  expect_refused({"--config", binary}, {binary + ":2", "not a text file"});
  EXPECT_EQ(parse_train_options({"--config", write("good.ini", "steps = 7\r\n")}).steps, 7);
}

}  // namespace
}  // namespace scalestudy
