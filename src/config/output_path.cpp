#include "config/output_path.h"

#include <unistd.h>

#include <filesystem>

#include "config/command_options.h"

namespace scalestudy {
namespace {

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  return !b.empty() && std::filesystem::exists(a, error) && std::filesystem::equivalent(a, b, error);
}

}  // namespace

void check_output_path(const OutputPathCheck& check) {
  const std::string& output = check.output;
  std::error_code error;
  if (std::filesystem::is_directory(output, error)) bad_value("output", output, "is a directory");
  for (const auto& [option, path] : check.inputs)
    if (same_file(output, path)) bad_value("output", output, "is also the run's --" + option);
  if (std::filesystem::exists(output, error) && !check.overwrite)
    bad_value("output", output, "exists; pass --overwrite to replace it");
  const std::filesystem::path folder = std::filesystem::absolute(output).parent_path();
  std::filesystem::create_directories(folder, error);
  if (error) bad_value("output", output, "cannot create its folder (" + error.message() + ")");
  if (access(folder.c_str(), W_OK) != 0) bad_value("output", output, "its folder is not writable");
}

}  // namespace scalestudy
