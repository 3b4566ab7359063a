// The file of GEMM algorithms chosen under sustained load (--gemm-algos-file): what one run
// stores, the next run on the same machine finds; a file made on another machine is set
// aside whole; a shape stored twice keeps its last algorithm; each choice made is reported
// as it is stored.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/gemm_choice_file.h"

namespace scalestudy {
namespace {

std::string temporary_path(const std::string& name) {
  return ::testing::TempDir() + "gemm_choice_file_" + std::to_string(::getpid()) + "_" + name;
}

std::string contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(GemmChoiceFile, WhatOneRunStoresTheNextFinds) {
  const std::string path = temporary_path("round_trip");
  std::remove(path.c_str());
  {
    GemmChoiceFile first(path, "NVIDIA H200 | cuBLASLt 130100");
    EXPECT_EQ(first.size(), 0u) << "no file yet";
    first.store("plain bf16 NN m=768 n=65536 k=2304", "lt id=66 tile=29 stages=35");
    first.store("bias bf16 m=2304 n=65536 k=768", "lt id=66 tile=24 stages=35");
    first.store("plain bf16 NN m=768 n=65536 k=2304", "cublas");
  }
  EXPECT_EQ(contents(path),
            "scalestudy gemm algorithms for NVIDIA H200 | cuBLASLt 130100\n"
            "bias bf16 m=2304 n=65536 k=768\tlt id=66 tile=24 stages=35\n"
            "plain bf16 NN m=768 n=65536 k=2304\tcublas\n");
  GemmChoiceFile second(path, "NVIDIA H200 | cuBLASLt 130100");
  EXPECT_TRUE(second.set_aside_because().empty());
  EXPECT_EQ(second.size(), 2u);
  EXPECT_EQ(second.find("plain bf16 NN m=768 n=65536 k=2304"), "cublas") << "the last store wins";
  EXPECT_EQ(second.find("bias bf16 m=2304 n=65536 k=768"), "lt id=66 tile=24 stages=35");
  EXPECT_FALSE(second.find("plain bf16 NN m=768 n=65536 k=768").has_value());
  std::remove(path.c_str());
}

TEST(GemmChoiceFile, AFileOfAnotherMachineIsSetAsideAndThenReplaced) {
  const std::string path = temporary_path("other_machine");
  GemmChoiceFile(path, "NVIDIA H100 80GB HBM3 | cuBLASLt 130100").store("shape", "lt id=1");
  GemmChoiceFile here(path, "NVIDIA H200 | cuBLASLt 130100");
  EXPECT_EQ(here.size(), 0u);
  EXPECT_NE(here.set_aside_because().find("made for NVIDIA H100 80GB HBM3"), std::string::npos)
      << here.set_aside_because();
  here.store("shape", "cublas");
  EXPECT_EQ(contents(path), "scalestudy gemm algorithms for NVIDIA H200 | cuBLASLt 130100\nshape\tcublas\n");
  std::remove(path.c_str());
}

TEST(GemmChoiceFile, WithoutAPathNothingIsWritten) {
  GemmChoiceFile in_memory("", "NVIDIA H200 | cuBLASLt 130100");
  in_memory.store("shape", "cublas");
  EXPECT_EQ(in_memory.find("shape"), "cublas");
}

TEST(GemmChoiceFile, EachChoiceStoredIsReportedAsItIsMade) {
  const std::string path = temporary_path("progress");
  std::remove(path.c_str());
  GemmChoiceFile(path, "NVIDIA H200 | cuBLASLt 130100").store("kept from before", "cublas");
  GemmChoiceFile file(path, "NVIDIA H200 | cuBLASLt 130100");
  std::ostringstream progress;
  file.report_progress_to(&progress);
  EXPECT_EQ(file.find("kept from before"), "cublas");
  EXPECT_EQ(progress.str(), "") << "a choice found in the file is not made again";
  file.store("bias bf16 m=2304 n=65536 k=768", "lt id=66 tile=408");
  file.store("plain bf16 m=768 n=65536 k=768", "cublas");
  EXPECT_EQ(progress.str(),
            "gemm algorithm 1 chosen under sustained load: bias bf16 m=2304 n=65536 k=768: lt id=66 tile=408\n"
            "gemm algorithm 2 chosen under sustained load: plain bf16 m=768 n=65536 k=768: cublas\n");
  file.report_progress_to(nullptr);
  file.store("plain bf16 m=768 n=768 k=65536", "cublas");
  EXPECT_EQ(progress.str().find("m=768 n=768"), std::string::npos) << "reported after reporting stopped";
  std::remove(path.c_str());
}

}  // namespace
}  // namespace scalestudy
