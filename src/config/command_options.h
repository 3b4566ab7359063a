#pragma once
// The options of a subcommand: declared in titled sections, whose declarations its --help
// prints, each entry wrapped within kHelpLineLength columns; and read from its command
// line and an optional INI file (--config), strictly: no guessed abbreviations, no stray
// positional arguments, and a config file that is a readable text file whose every error
// names the file and the line.
#include <boost/program_options.hpp>

#include <functional>
#include <map>
#include <string>

namespace scalestudy {

inline constexpr unsigned kHelpLineLength = 100;
// The descriptions' column starts at most this far from the line's end; an option whose
// name and default are longer starts its description on the next line.
inline constexpr unsigned kHelpMinDescriptionLength = 66;

// One titled section of a subcommand's options.
inline boost::program_options::options_description help_section(const std::string& caption) {
  return boost::program_options::options_description(caption, kHelpLineLength, kHelpMinDescriptionLength);
}

// The value of an option stored in `field`, whose --help shows the field's initial value
// as the default: the default is written once, where the field is.
template <typename T>
boost::program_options::typed_value<T>* defaulted(T* field) {
  return boost::program_options::value(field)->default_value(*field);
}

// The sections together, in the order --help prints them.
inline boost::program_options::options_description help_sections() {
  return boost::program_options::options_description(kHelpLineLength, kHelpMinDescriptionLength);
}

// Where the options that a --config file set are set: the file, and the line of each option
// that the command line does not override.
struct ConfigLines {
  std::string path;
  std::map<std::string, size_t> line_of_option;  // option name (no --) -> 1-based line
};

// Parses argv (argv[0] is the subcommand) into `values`, then the INI file that --config
// names, if any: the command line wins, and every line of the file is still checked.
// Throws UsageError naming the option, or the file and the line. Returns where the file's
// options were set.
ConfigLines parse_options(int argc, const char* const* argv,
                          const boost::program_options::options_description& options,
                          boost::program_options::variables_map& values);

// Runs `check`, the checks of the parsed values. A UsageError it throws about an option
// ("--name ...") that the config file set is thrown again prefixed with the file and line.
void naming_config_lines(const ConfigLines& lines, const std::function<void()>& check);

// Whether the user gave `option` (on the command line or in the config file), rather than
// leaving its default.
bool given(const boost::program_options::variables_map& values, const char* option);

// Throws the UsageError "--OPTION VALUE: WHY".
[[noreturn]] void bad_value(const std::string& option, const std::string& value, const std::string& why);

// Checks --comm-timeout, in seconds, against kMinCommTimeoutS and kMaxCommTimeoutS
// (control/control_wait.h says why); throws the UsageError naming it.
void check_comm_timeout(double seconds);
// The bounds of --comm-timeout, as its --help and its error say them.
extern const char* const kCommTimeoutBounds;

}  // namespace scalestudy
