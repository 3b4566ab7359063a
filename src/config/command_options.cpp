#include "config/command_options.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string_view>
#include <vector>

#include "control/control_wait.h"
#include "core/usage_error.h"

namespace po = boost::program_options;

namespace scalestudy {
namespace {

// The command line's style without allow_guessing: "--outp" is not taken for "--output".
constexpr int kStrictStyle = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;

// The whole file, or a UsageError naming it with the OS's error: a read that fails
// part-way (EIO, or /proc/self/mem, whose first page is unmapped) is no end of file.
std::string read_config_text(const std::string& path) {
  const std::string where = "--config " + path;
  std::error_code error;
  if (!std::filesystem::exists(path, error)) throw UsageError(where + ": no such file");
  if (!std::filesystem::is_regular_file(path, error)) throw UsageError(where + ": not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UsageError(where + ": cannot be opened: " + std::strerror(errno));
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got > 0) {
      text.append(buffer, static_cast<size_t>(got));
    } else if (got == 0) {
      break;
    } else if (errno != EINTR) {
      const int read_errno = errno;
      ::close(fd);
      throw UsageError(where + ": cannot be read: " + std::strerror(read_errno));
    }
  }
  ::close(fd);
  return text;
}

std::vector<std::string> read_config_lines(const std::string& path) {
  const std::string where = "--config " + path;
  std::string text = read_config_text(path);
  // Editors on Windows start a UTF-8 file with a byte-order mark, which is no part of the
  // first key.
  constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";
  if (std::string_view(text).substr(0, kUtf8Bom.size()) == kUtf8Bom) text.erase(0, kUtf8Bom.size());
  std::istringstream file(text);
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

// The key of a "key = value" line, without leading dashes, or "" for a blank line.
std::string key_of(const std::string& line) {
  const size_t start = line.find_first_not_of(" \t-");
  if (start == std::string::npos) return "";
  const size_t end = line.find_first_of(" \t=", start);
  return line.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The 1-based line of the file that sets `option` the `nth` time (1: the first), or 0.
// Boost names an option of an INI section "section.option", and its line says "option".
size_t line_of(const std::vector<std::string>& lines, const std::string& option, int nth = 1) {
  const size_t first = option.find_first_not_of('-');
  const std::string bare = first == std::string::npos ? "" : option.substr(first);
  const size_t dot = bare.rfind('.');
  for (const std::string& name : {bare, dot == std::string::npos ? bare : bare.substr(dot + 1)}) {
    int seen = 0;
    for (size_t i = 0; i < lines.size(); ++i)
      if (key_of(lines[i]) == name && ++seen == nth) return i + 1;
  }
  return 0;
}

// The 1-based line that Boost's message quotes ("... an invalid line 'steps 3'"), or 0.
size_t quoted_line(const std::vector<std::string>& lines, const std::string& message) {
  const size_t open = message.find('\'');
  const size_t close = message.rfind('\'');
  if (open == std::string::npos || close <= open) return 0;
  const std::string quoted = message.substr(open + 1, close - open - 1);
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t first = lines[i].find_first_not_of(" \t");
    const size_t last = lines[i].find_last_not_of(" \t");
    if (first != std::string::npos && lines[i].substr(first, last - first + 1) == quoted) return i + 1;
  }
  return 0;
}

std::string where(const std::string& path, size_t line) {
  return "--config " + path + (line ? ":" + std::to_string(line) : "") + ": ";
}

ConfigLines parse_config_file(const std::string& path, const po::options_description& options,
                              po::variables_map& values) {
  const std::vector<std::string> lines = read_config_lines(path);
  for (const char* own : {"config", "help"})
    if (const size_t line = line_of(lines, own))
      throw UsageError(where(path, line) + "'" + own + " =' belongs on the command line, not in a config file");
  std::ostringstream joined;
  for (const std::string& line : lines) joined << line << '\n';
  std::istringstream text(joined.str());
  ConfigLines config{path, {}};
  try {
    const po::parsed_options parsed = po::parse_config_file(text, options, /*allow_unregistered=*/false);
    // Every line is checked, also those the command line overrides: an error in the file
    // is an error whether or not this run uses that line.
    po::variables_map every_line;
    po::store(parsed, every_line);
    for (const po::option& option : parsed.options)
      if (!values.count(option.string_key) || values[option.string_key].defaulted())
        config.line_of_option[option.string_key] = line_of(lines, option.string_key);
    // Values already stored from the command line are kept: the command line wins.
    po::store(parsed, values);
  } catch (const po::multiple_occurrences& error) {
    throw UsageError(where(path, line_of(lines, error.get_option_name(), 2)) + error.what());
  } catch (const po::error_with_option_name& error) {
    const size_t line = line_of(lines, error.get_option_name());
    throw UsageError(where(path, line ? line : quoted_line(lines, error.what())) + error.what());
  } catch (const po::error& error) {
    throw UsageError(where(path, quoted_line(lines, error.what())) + error.what());
  }
  return config;
}

// "--name" at the start of a UsageError's message, without the dashes, or "".
std::string option_named_by(const std::string& message) {
  if (message.rfind("--", 0) != 0) return "";
  return message.substr(2, message.find_first_of(" :", 2) - 2);
}

}  // namespace

ConfigLines parse_options(int argc, const char* const* argv, const po::options_description& options,
                          po::variables_map& values) {
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
  if (values.count("help")) return {};
  ConfigLines config;
  if (values.count("config")) config = parse_config_file(values["config"].as<std::string>(), options, values);
  try {
    po::notify(values);
  } catch (const po::error& error) {
    throw UsageError(error.what());
  }
  return config;
}

void naming_config_lines(const ConfigLines& config, const std::function<void()>& check) {
  try {
    check();
  } catch (const UsageError& error) {
    const auto set = config.line_of_option.find(option_named_by(error.what()));
    if (set == config.line_of_option.end()) throw;
    throw UsageError(where(config.path, set->second) + error.what());
  }
}

bool given(const po::variables_map& values, const char* option) {
  return values.count(option) && !values[option].defaulted();
}

void bad_value(const std::string& option, const std::string& value, const std::string& why) {
  throw UsageError("--" + option + " " + one_line(value) + ": " + why);
}

const char* const kCommTimeoutBounds = "1 to 1e6 s";

void check_comm_timeout(double seconds) {
  if (seconds >= kMinCommTimeoutS && seconds <= kMaxCommTimeoutS) return;
  std::ostringstream value;
  value << seconds;
  bad_value("comm-timeout", value.str(),
            std::string("must be ") + kCommTimeoutBounds + " (it bounds the start-up too, where ranks arrive up to 0.5 s apart)");
}

}  // namespace scalestudy
