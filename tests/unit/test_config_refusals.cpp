// Values that were once accepted silently, and paths and config files that were misread:
// each is refused with a UsageError that names the option (or the file and its line), in
// one line.
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

TEST(ConfigRefusals, ZeroIsNoSilentDefault) {
  // Left out, each of these means the preset's value (or 4, or --max-seq); given as 0, it
  // would be taken for that without a word.
  for (const char* option : {"--layers", "--hidden", "--heads", "--vocab", "--max-seq", "--seq", "--batch-per-rank"})
    expect_refused({option, "0"}, {std::string(option) + " 0", "at least 1", "leave it out"});
  EXPECT_EQ(parse_train_options({"--layers", "1"}).shape.layers, 1);
}

TEST(ConfigRefusals, SeedAndExperimentText) {
  expect_refused({"--seed", " 5"}, {"--seed  5", "whole number"});
  expect_refused({"--seed", "+5"}, {"--seed +5", "whole number"});
  expect_refused({"--experiment", "sweep\nrm -rf /"}, {"--experiment 'sweep\\x0arm -rf /'", "control character"});
  expect_refused({"--experiment", "a\x1b[2Jb"}, {"--experiment", "control character"});
  EXPECT_EQ(parse_train_options({"--experiment", "strong scaling, 2024"}).experiment, "strong scaling, 2024");
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

TEST_F(ScratchFolder, ConfigFileErrorsNameTheLineWhereverTheyAreFound) {
  // Lines that Boost cannot read, named by the line Boost quotes or the key it names.
  const std::string no_equals = write("no_equals.ini", "steps = 3\nlayers 2\n");
  expect_refused({"--config", no_equals}, {no_equals + ":2", "invalid line"});
  const std::string dashes = write("dashes.ini", "\n--layers = 2\n");
  expect_refused({"--config", dashes}, {dashes + ":2", "--layers"});
  const std::string section = write("section.ini", "steps = 3\n[train]\nlayers = 2\n");
  expect_refused({"--config", section}, {section + ":3", "train.layers"});
  const std::string twice = write("twice.ini", "layers = 2\nsteps = 3\nlayers = 4\n");
  expect_refused({"--config", twice}, {twice + ":3", "more than once"});
  const std::string help = write("help.ini", "steps = 3\nhelp = 1\n");
  expect_refused({"--config", help}, {help + ":2", "help ="});
  // A bad line is refused even where the command line overrides it.
  const std::string overridden = write("overridden.ini", "layers = two\n");
  expect_refused({"--config", overridden, "--layers", "2"}, {overridden + ":1", "layers", "two"});
  // Values that Boost reads and the checks refuse name the file's line too.
  const std::string values = write("values.ini", "steps = 3\n\nlr = inf\n");
  expect_refused({"--config", values}, {values + ":3", "--lr inf", "finite"});
  const std::string strategy = write("strategy.ini", "strategy = zero3\n");
  expect_refused({"--config", strategy}, {strategy + ":1", "--strategy zero3"});
  const std::string zero = write("zero.ini", "steps = 3\nlayers = 0\n");
  expect_refused({"--config", zero}, {zero + ":2", "--layers 0"});
  // The command line's own bad values name no file.
  expect_refused({"--config", write("fine.ini", "steps = 3\n"), "--lr", "nan"}, {"--lr nan"});
  EXPECT_EQ(refusal({"--config", write("fine2.ini", "steps = 3\n"), "--lr", "nan"}).find("--config"), std::string::npos);
}

}  // namespace
}  // namespace scalestudy
