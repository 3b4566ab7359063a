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

// The nearest folder that exists on the way to `folder` is one where the rest of the way
// could be made (or where the file could be written, if it is `folder` itself).
void check_folder_could_be_made(const std::string& output, std::filesystem::path folder) {
  std::error_code error;
  while (!std::filesystem::exists(folder, error) && folder.has_relative_path()) folder = folder.parent_path();
  if (!std::filesystem::is_directory(folder, error))
    bad_value("output", output, "its folder would be made under " + folder.string() + ", which is not a folder");
  if (access(folder.c_str(), W_OK) != 0)
    bad_value("output", output, "its folder would be made in " + folder.string() + ", which is not writable");
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
  if (!check.create_folder) {
    check_folder_could_be_made(output, folder);
    return;
  }
  std::filesystem::create_directories(folder, error);
  if (error) bad_value("output", output, "cannot create its folder (" + error.message() + ")");
  if (access(folder.c_str(), W_OK) != 0) bad_value("output", output, "its folder is not writable");
}

}  // namespace scalestudy
