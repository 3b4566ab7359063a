#pragma once
// Reading the options of a subcommand from its command line and an optional INI file
// (--config), strictly: no guessed abbreviations, no stray positional arguments, and a
// config file that is a readable text file whose every error names the file and the line.
#include <boost/program_options.hpp>

#include <string>

namespace scalestudy {

// Parses argv (argv[0] is the subcommand) into `values`, then the INI file that --config
// names, if any: the command line wins. Throws UsageError naming the option, or the file and
// the line.
void parse_options(int argc, const char* const* argv, const boost::program_options::options_description& options,
                   boost::program_options::variables_map& values);

// Whether the user gave `option` (on the command line or in the config file), rather than
// leaving its default.
bool given(const boost::program_options::variables_map& values, const char* option);

}  // namespace scalestudy
