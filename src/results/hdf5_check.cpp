#include "results/hdf5_check.h"

namespace scalestudy {
namespace {

herr_t collect_hdf5_error(unsigned, const H5E_error2_t* error, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (!text->empty()) *text += "; ";
  *text += error->desc ? error->desc : "?";
  if (error->func_name) *text += std::string(" (in ") + error->func_name + ")";
  return 0;
}

}  // namespace

std::string hdf5_error_string() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_hdf5_error, &text);
  return text.empty() ? "HDF5 call failed (no error stack)" : text;
}

}  // namespace scalestudy
