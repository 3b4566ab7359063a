#include "results/hdf5_check.h"

#include <cerrno>
#include <cstring>

namespace scalestudy {
namespace {

struct StackSummary {
  std::string innermost;  // the description of the deepest error on the stack
  std::string os_error;   // "'<file>': <the OS's message>", where an entry carries errno
};

// HDF5's low-level I/O errors describe themselves as "... filename = 'F', ..., errno = N,
// error message = 'M', ...": the file and the OS's message are what a user can act on.
std::string quoted_field(const std::string& text, const std::string& field) {
  const size_t at = text.find(field + " = '");
  if (at == std::string::npos) return "";
  const size_t begin = at + field.size() + 4;
  const size_t end = text.find('\'', begin);
  return end == std::string::npos ? "" : text.substr(begin, end - begin);
}

herr_t summarize_entry(unsigned, const H5E_error2_t* error, void* out) {
  auto* summary = static_cast<StackSummary*>(out);
  const std::string desc = error->desc ? error->desc : "";
  if (!desc.empty()) summary->innermost = desc;
  const std::string message = quoted_field(desc, "error message");
  if (!message.empty() && summary->os_error.empty()) {
    const std::string file = quoted_field(desc, "filename");
    summary->os_error = (file.empty() ? "" : "'" + file + "': ") + message;
  }
  return 0;
}

}  // namespace

void silence_hdf5_error_printing() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string hdf5_error_string() {
  const int saved_errno = errno;
  StackSummary summary;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, summarize_entry, &summary);
  if (!summary.os_error.empty()) return summary.os_error;
  if (saved_errno != 0 && !summary.innermost.empty()) return summary.innermost + " (" + std::strerror(saved_errno) + ")";
  return summary.innermost.empty() ? "HDF5 call failed (no error stack)" : summary.innermost;
}

}  // namespace scalestudy
