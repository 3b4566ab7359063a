#pragma once
// The checks of a result file's path, made before anything runs, for `train` and `bench`
// alike: a run never replaces its own inputs, a folder or, unless told to, a result that
// exists, and finds out before its first step that it cannot write where it was asked to.
#include <string>
#include <utility>
#include <vector>

namespace scalestudy {

struct OutputPathCheck {
  std::string output;     // the --output value, not empty
  bool overwrite = false; // --overwrite: an existing file may be replaced
  // The run's input files as (option, path): the output may be none of them.
  std::vector<std::pair<std::string, std::string>> inputs;
  // false (train --check): the folder is not made; the nearest folder that exists on the
  // way to it must be one the run could make it in.
  bool create_folder = true;
};

// Throws UsageError naming --output and its value where the path is a folder, one of the
// inputs, an existing file without --overwrite, or in a folder that cannot be created or
// written. Creates the output's folder where it is missing, unless told not to.
void check_output_path(const OutputPathCheck& check);

}  // namespace scalestudy
