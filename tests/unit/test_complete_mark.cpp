// The complete mark means complete (results/complete_mark.h): a result file that reads back
// whole is marked complete and renamed; one with a dataset whose header cannot be read, or
// with fewer steps than were written, is marked failed naming that dataset, never complete.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "results/complete_mark.h"
#include "results/hdf5_io.h"
#include "scratch_folder.h"

namespace scalestudy {
namespace {

constexpr hsize_t kSteps = 5;

// The output of a run in the test's folder: the complete mark renames the partial to it.
class CompleteMark : public ScratchFolder {
 protected:
  std::string output() const { return path("run.h5"); }
};

// A file shaped like a run's: root status "running", /steps/loss and /steps/step_index of
// kSteps rows (chunked and grown, as a run writes them), and a string attribute.
void write_run_like_file(const std::string& path) {
  h5::Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  h5::set_attribute(file.get(), "status", "running");
  h5::Handle steps = h5::create_group(file.get(), "steps");
  h5::GrowingDataset loss(steps.get(), "loss", H5T_NATIVE_DOUBLE, {}, 2);
  h5::GrowingDataset index(steps.get(), "step_index", H5T_NATIVE_INT64, {}, 2);
  h5::set_attribute(loss.id(), "units", "nats");
  for (hsize_t step = 0; step < kSteps; ++step) {
    const double value = 1.0 / static_cast<double>(step + 1);
    const int64_t at = static_cast<int64_t>(step);
    loss.append(&value, 1);
    index.append(&at, 1);
  }
}

haddr_t object_address(const std::string& path, const char* name) {
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  EXPECT_GE(H5Oget_info_by_name3(file.get(), name, &info, H5O_INFO_BASIC, H5P_DEFAULT), 0);
  haddr_t address = HADDR_UNDEF;
  EXPECT_GE(H5VLnative_token_to_addr(file.get(), info.token, &address), 0);
  return address;
#else
  H5O_info_t info;
  EXPECT_GE(H5Oget_info_by_name2(file.get(), name, &info, H5O_INFO_BASIC, H5P_DEFAULT), 0);
  return info.addr;
#endif
}

// Overwrites the first bytes of the object's header, its version (or signature): HDF5 then
// refuses to open the object, as it refused the steps of a file that two runs wrote.
void corrupt_header(const std::string& path, const char* name) {
  const haddr_t address = object_address(path, name);
  ASSERT_NE(address, HADDR_UNDEF);
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(static_cast<std::streamoff>(address));
  const char garbage[4] = {'\x7f', '\x7f', '\x7f', '\x7f'};
  file.write(garbage, sizeof(garbage));
}

std::string root_attribute(const std::string& path, const char* name) {
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  h5::Handle attribute(H5Aopen(file.get(), name, H5P_DEFAULT));
  h5::Handle type(H5Aget_type(attribute.get()));
  char* text = nullptr;
  if (H5Aread(attribute.get(), type.get(), &text) < 0 || text == nullptr) return "<unreadable>";
  const std::string value = text;
  H5free_memory(text);
  return value;
}

TEST_F(CompleteMark, AFileThatReadsBackIsMarkedCompleteAndRenamed) {
  const std::string output = this->output();
  const std::string partial = output + ".partial";
  write_run_like_file(partial);
  EXPECT_EQ(read_back_error(partial, kSteps), "");
  EXPECT_EQ(mark_complete({.partial = partial, .output = output, .steps_rows = kSteps}), "");
  ASSERT_TRUE(std::filesystem::exists(output));
  EXPECT_FALSE(std::filesystem::exists(partial));
  EXPECT_EQ(root_attribute(output, "status"), "complete");
  EXPECT_EQ(root_attribute(output, "failure_reason"), "");
}

TEST_F(CompleteMark, ADatasetWhoseHeaderDoesNotReadIsMarkedFailedNamingIt) {
  const std::string output = this->output();
  const std::string partial = output + ".partial";
  write_run_like_file(partial);
  corrupt_header(partial, "/steps/loss");
  const std::string error = read_back_error(partial, kSteps);
  EXPECT_EQ(error.rfind("/steps/loss: ", 0), 0u) << error;
  const std::string reason = mark_complete({.partial = partial, .output = output, .steps_rows = kSteps});
  EXPECT_NE(reason.find("could not be marked complete: /steps/loss: "), std::string::npos) << reason;
  ASSERT_TRUE(std::filesystem::exists(output)) << "a failed file still takes its final name";
  EXPECT_EQ(root_attribute(output, "status"), "failed");
  EXPECT_EQ(root_attribute(output, "failure_reason"), reason);
}

TEST_F(CompleteMark, FewerStepsThanWrittenIsMarkedFailed) {
  const std::string output = this->output();
  const std::string partial = output + ".partial";
  write_run_like_file(partial);
  const std::string reason = mark_complete({.partial = partial, .output = output, .steps_rows = kSteps + 1});
  EXPECT_NE(reason.find("/steps/loss holds 5 rows, 6 steps were written"), std::string::npos) << reason;
  EXPECT_EQ(root_attribute(output, "status"), "failed");
}

TEST_F(CompleteMark, AFileThatCannotBeOpenedStaysPartialNeverComplete) {
  const std::string output = this->output();
  const std::string partial = output + ".partial";
  std::ofstream(partial) << "not an HDF5 file";
  const std::string reason = mark_complete({.partial = partial, .output = output, .steps_rows = kSteps});
  EXPECT_NE(reason.find("cannot be opened"), std::string::npos) << reason;
  EXPECT_TRUE(std::filesystem::exists(partial));
  EXPECT_FALSE(std::filesystem::exists(output));
}

}  // namespace
}  // namespace scalestudy
