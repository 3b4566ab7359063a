#pragma once
// The layout of every subcommand's --help: options are declared in sections, and the
// help prints those declarations, each entry wrapped within kHelpLineLength columns.
#include <boost/program_options/options_description.hpp>
#include <boost/program_options/value_semantic.hpp>

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

}  // namespace scalestudy
