#pragma once
// The complete mark means complete: a result file is called complete only once it reads
// back whole. A file that HDF5 wrote without an error can still fail to read (another
// program wrote to it, a file system lost a write), and only reading it shows that.
#include <hdf5.h>

#include <optional>
#include <string>

namespace scalestudy {

// Opens `path` read-only and reads every object's header and attributes and every
// dataset's values; where steps_rows is given, each dataset under /steps must hold that
// many rows. Returns "" when all of it reads back, else one line naming the first object
// that does not and why (HDF5's error, or the rows found and expected).
std::string read_back_error(const std::string& path, std::optional<hsize_t> steps_rows);

// Renames the closed file `partial` to `output`, its final name; where that fails, says on
// stderr that the file stays at `partial`, and returns false.
bool give_final_name(const std::string& partial, const std::string& output);

struct CompleteMarkArgs {
  std::string partial;  // the closed file, every dataset written
  std::string output;   // its final name
  std::optional<hsize_t> steps_rows;  // as for read_back_error
};

// Reads the closed file back, marks it complete (status, failure_reason, end_time), writes
// it to the disk (fsync), reads it back again and renames it to its final name. A file that does not read back is
// marked failed instead, with the reason, and renamed; one that cannot even be marked
// failed stays at its .partial name, never called complete. Returns "" when the file is
// complete, else the reason it is not.
std::string mark_complete(const CompleteMarkArgs& args);

}  // namespace scalestudy
