// A folder of each test's own under the system's temporary directory, named by process and
// test so that concurrent test processes never share one, and removed with everything in it
// when the test ends, whether it passed or not.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace scalestudy {

class ScratchFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    folder_ = std::filesystem::temp_directory_path() /
              ("scalestudy-test-" + std::to_string(::getpid()) + "-" + test->test_suite_name() + "-" +
               test->name());
    std::filesystem::remove_all(folder_);
    std::filesystem::create_directories(folder_);
  }
  void TearDown() override { std::filesystem::remove_all(folder_); }

  std::string folder() const { return folder_.string(); }

  // The path of `name` in the folder; nothing is created.
  std::string path(const std::string& name) const { return (folder_ / name).string(); }

  // Writes `content` to `name` in the folder, byte for byte, and returns its path.
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(folder_ / name, std::ios::binary) << content;
    return path(name);
  }

 private:
  std::filesystem::path folder_;
};

}  // namespace scalestudy
