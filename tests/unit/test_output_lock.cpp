// One writer per result file (results/output_lock.h): a second lock on the same output is
// refused naming the holder's pid and host, the lock file goes once the holder releases it,
// and a lock file left by a run that died (no lock on it) is taken over. flock conflicts
// between two open descriptions of one file even in one process, so one process shows it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/check.h"
#include "core/usage_error.h"
#include "results/output_lock.h"

namespace scalestudy {
namespace {

std::string temporary_output(const std::string& name) {
  const std::string output = ::testing::TempDir() + "output_lock_" + std::to_string(::getpid()) + "_" + name + ".h5";
  std::filesystem::remove(output_lock_path(output));
  return output;
}

std::string contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string refusal(const std::string& output) {
  try {
    OutputLock second(output);
  } catch (const UsageError& error) {
    return error.what();
  }
  return "";
}

TEST(OutputLock, ASecondWriterIsRefusedNamingTheHolder) {
  const std::string output = temporary_output("second");
  {
    OutputLock first(output);
    const std::string holder = "pid " + std::to_string(::getpid()) + " on host " + host_name();
    EXPECT_EQ(contents(output_lock_path(output)).rfind(holder, 0), 0u) << contents(output_lock_path(output));
    const std::string message = refusal(output);
    EXPECT_NE(message.find("--output " + output + ": is being written by another run (" + holder), std::string::npos)
        << message;
    EXPECT_NE(message.find("lock file " + output_lock_path(output)), std::string::npos) << message;
    EXPECT_FALSE(std::filesystem::exists(output)) << "the refused lock touched no file of the output's name";
  }
  EXPECT_FALSE(std::filesystem::exists(output_lock_path(output))) << "the holder removes its lock file";
  EXPECT_EQ(refusal(output), "") << "a released output is free";
}

TEST(OutputLock, ALockFileLeftByADeadRunIsTakenOver) {
  const std::string output = temporary_output("stale");
  std::ofstream(output_lock_path(output)) << "pid 1 on host gone, since 2000-01-01T00:00:00Z\n";
  OutputLock lock(output);
  const std::string holder = "pid " + std::to_string(::getpid()) + " on host " + host_name();
  EXPECT_EQ(contents(output_lock_path(output)).rfind(holder, 0), 0u) << contents(output_lock_path(output));
}

}  // namespace
}  // namespace scalestudy
