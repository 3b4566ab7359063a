#pragma once
// A test's training: its options parsed as the command line parses them (the test fails
// when they do not parse), a whole run on the CPU backend, and the comparison the tests
// make of its result.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "comm/mpi_communicator.h"
#include "config/run_config.h"
#include "train/trainer.h"

namespace scalestudy {

// `options` are what follows "train" on the command line.
inline RunConfig parse_train_options(const std::vector<std::string>& options) {
  std::vector<const char*> argv = {"train"};
  for (const std::string& option : options) argv.push_back(option.c_str());
  RunConfig config;
  EXPECT_TRUE(parse_train_config(static_cast<int>(argv.size()), argv.data(), config));
  return config;
}

// Trains `config` on the ranks of `comm_world` (MPI_COMM_SELF: this rank alone) and returns
// this rank's parameters after the last step.
inline std::vector<float> train_on_cpu(const RunConfig& config, MPI_Comm comm_world = MPI_COMM_WORLD) {
  CpuOps ops;
  MpiCommunicator comm(comm_world, 120.0);
  Trainer trainer(config, ops, comm, comm_world);
  trainer.run(nullptr);
  return trainer.parameters_on_host();
}

// Elements that are not bit-for-bit equal (a NaN counts as differing); a and b are the same size.
inline size_t count_differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  return differing;
}

}  // namespace scalestudy
