#include "config/option_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/usage_error.h"

namespace po = boost::program_options;

namespace scalestudy {
namespace {

// The command line's style without allow_guessing: "--outp" is not taken for "--output".
constexpr int kStrictStyle = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

std::vector<std::string> read_config_lines(const std::string& path) {
  const std::string where = "--config " + path;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) throw UsageError(where + ": no such file");
  if (!std::filesystem::is_regular_file(path, error)) throw UsageError(where + ": not a regular file");
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UsageError(where + ": cannot be read (permission denied?)");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(file, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const bool text = std::none_of(line.begin(), line.end(), [](char ch) {
      const auto byte = static_cast<unsigned char>(ch);
      return byte < 0x20 && ch != '\t';
    });
    if (!text)
      throw UsageError(where + ":" + std::to_string(lines.size() + 1) + ": not a text file (a control byte)");
    lines.push_back(line);
  }
  return lines;
}

// The 1-based line of the file that sets `option`, or 0.
size_t line_of(const std::vector<std::string>& lines, const std::string& option) {
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    const size_t end = line.find_first_of(" \t=", start);
    if (line.compare(start, end - start, option) == 0) return i + 1;
  }
  return 0;
}

void parse_config_file(const std::string& path, const po::options_description& options, po::variables_map& values) {
  const std::vector<std::string> lines = read_config_lines(path);
  if (const size_t line = line_of(lines, "config"))
    throw UsageError("--config " + path + ":" + std::to_string(line) + ": a config file cannot name another (config =)");
  std::ostringstream joined;
  for (const std::string& line : lines) joined << line << '\n';
  std::istringstream text(joined.str());
  try {
    // Values already stored from the command line are kept: the command line wins.
    po::store(po::parse_config_file(text, options, /*allow_unregistered=*/false), values);
  } catch (const po::error_with_option_name& error) {
    const std::string option = error.get_option_name();
    const std::string name = option.rfind("--", 0) == 0 ? option.substr(2) : option;
    const size_t line = line_of(lines, name);
    throw UsageError("--config " + path + (line ? ":" + std::to_string(line) : "") + ": " + error.what());
  } catch (const po::error& error) {
    throw UsageError("--config " + path + ": " + error.what());
  }
}

}  // namespace

void parse_options(int argc, const char* const* argv, const po::options_description& options, po::variables_map& values) {
  // Positional arguments are caught, so that a stray one is named rather than ignored.
  constexpr const char* kStray = "stray-argument";
  po::options_description with_stray;
  with_stray.add(options).add_options()(kStray, po::value<std::vector<std::string>>());
  po::positional_options_description stray;
  stray.add(kStray, -1);
  try {
    po::store(po::command_line_parser(argc, argv).options(with_stray).positional(stray).style(kStrictStyle).run(),
              values);
  } catch (const po::error& error) {
    throw UsageError(error.what());
  }
  if (values.count(kStray))
    throw UsageError("unexpected argument '" + values[kStray].as<std::vector<std::string>>().front() +
                     "' (every option starts with --)");
  if (values.count("help")) return;
  if (values.count("config")) parse_config_file(values["config"].as<std::string>(), options, values);
  try {
    po::notify(values);
  } catch (const po::error& error) {
    throw UsageError(error.what());
  }
}

bool given(const po::variables_map& values, const char* option) {
  return values.count(option) && !values[option].defaulted();
}

}  // namespace scalestudy
