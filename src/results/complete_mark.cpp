#include "results/complete_mark.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "results/hdf5_check.h"
#include "results/hdf5_io.h"
#include "results/provenance.h"

namespace scalestudy {
namespace {

struct Visit {
  hid_t file = -1;
  std::optional<hsize_t> steps_rows;
  size_t file_bytes = 0;
  std::string error;  // the first failure, naming its object
};

// The values of a dataset or an attribute, read into memory in their native type and
// dropped; variable-length strings are reclaimed. Returns "" or why they do not read.
// Every value scalestudy writes is stored (no fill values, no compression), so values
// that would take more memory than the whole file are a dataspace that did not read back.
std::string read_values(hid_t object, bool dataset, size_t file_bytes) {
  h5::Handle type(dataset ? H5Dget_type(object) : H5Aget_type(object));
  h5::Handle space(dataset ? H5Dget_space(object) : H5Aget_space(object));
  if (type.get() < 0 || space.get() < 0) return hdf5_error_string();
  h5::Handle memory(H5Tget_native_type(type.get(), H5T_DIR_ASCEND));
  const hssize_t points = H5Sget_select_npoints(space.get());
  const size_t point_bytes = memory.get() >= 0 ? H5Tget_size(memory.get()) : 0;
  if (points < 0 || point_bytes == 0) return hdf5_error_string();
  if (static_cast<size_t>(points) > file_bytes / point_bytes + 1)
    return std::to_string(points) + " values of " + std::to_string(point_bytes) + " bytes, more than the file holds";
  std::vector<unsigned char> values(static_cast<size_t>(points) * point_bytes);
  const herr_t read = dataset ? H5Dread(object, memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data())
                              : H5Aread(object, memory.get(), values.data());
  if (read < 0) return hdf5_error_string();
  if (H5Tis_variable_str(memory.get()) > 0 || H5Tdetect_class(memory.get(), H5T_VLEN) > 0) {
#if H5_VERSION_GE(1, 12, 0)
    H5Treclaim(memory.get(), space.get(), H5P_DEFAULT, values.data());
#else
    H5Dvlen_reclaim(memory.get(), space.get(), H5P_DEFAULT, values.data());
#endif
  }
  return "";
}

struct AttributeVisit {
  size_t file_bytes = 0;
  std::string error;  // the first failure, naming its attribute
};

herr_t read_attribute(hid_t object, const char* name, const H5A_info_t*, void* data) {
  auto* visit = static_cast<AttributeVisit*>(data);
  h5::Handle attribute(H5Aopen(object, name, H5P_DEFAULT));
  visit->error = attribute.get() < 0 ? hdf5_error_string() : read_values(attribute.get(), false, visit->file_bytes);
  if (!visit->error.empty()) visit->error = std::string("attribute ") + name + ": " + visit->error;
  return visit->error.empty() ? 0 : 1;
}

std::string rows_error(hid_t dataset, const std::string& name, hsize_t expected) {
  h5::Handle space(H5Dget_space(dataset));
  hsize_t dims[H5S_MAX_RANK] = {0};
  const int rank = H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  if (rank >= 1 && dims[0] == expected) return "";
  return "/" + name + " holds " + (rank >= 1 ? std::to_string(dims[0]) : std::string("no")) + " rows, " +
         std::to_string(expected) + " steps were written";
}

// Opens the object `name` and reads its attributes and, for a dataset, its values.
std::string check_object(const Visit& visit, const std::string& name) {
  const std::string shown = name == "." ? "/" : "/" + name;
  errno = 0;  // hdf5_error_string names errno where it is set: only this check's may be
  h5::Handle object(H5Oopen(visit.file, name.c_str(), H5P_DEFAULT));
  if (object.get() < 0) return shown + ": " + hdf5_error_string();
  AttributeVisit attributes{.file_bytes = visit.file_bytes, .error = ""};
  if (H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, read_attribute, &attributes) != 0)
    return shown + ": " + (attributes.error.empty() ? "its attributes: " + hdf5_error_string() : attributes.error);
  if (H5Iget_type(object.get()) != H5I_DATASET) return "";
  if (std::string error = read_values(object.get(), true, visit.file_bytes); !error.empty())
    return shown + ": " + error;
  if (visit.steps_rows && name.rfind("steps/", 0) == 0) return rows_error(object.get(), name, *visit.steps_rows);
  return "";
}

herr_t visit_link(hid_t, const char* name, const H5L_info_t*, void* data) {
  auto* visit = static_cast<Visit*>(data);
  visit->error = check_object(*visit, name);
  return visit->error.empty() ? 0 : 1;
}

// Writes the file's pages to the disk: what is read back is then what a later reader
// finds, not only the page cache's copy.
std::string durable_error(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot be opened (" + std::string(std::strerror(errno)) + ")";
  const bool synced = fsync(fd) == 0;
  const int error = errno;
  close(fd);
  return synced ? "" : "cannot be written to the disk (fsync: " + std::string(std::strerror(error)) + ")";
}

// Sets the root's status, failure_reason and end_time in the closed file `path`; returns
// "" or why they could not be written.
std::string set_status(const std::string& path, const std::string& status, const std::string& reason) {
  errno = 0;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return "cannot be opened for writing: " + hdf5_error_string();
  const bool written = h5::try_set_attribute(file, "status", status) &&
                       h5::try_set_attribute(file, "failure_reason", reason) &&
                       h5::try_set_attribute(file, "end_time", utc_now());
  std::string error = written ? "" : hdf5_error_string();
  if (H5Fclose(file) < 0 && error.empty()) error = hdf5_error_string();
  return error;
}

}  // namespace

bool give_final_name(const std::string& partial, const std::string& output) {
  std::error_code error;
  std::filesystem::rename(partial, output, error);
  if (error)
    std::fprintf(stderr, "scalestudy: %s stays %s (%s)\n", output.c_str(), partial.c_str(), error.message().c_str());
  return !error;
}

std::string read_back_error(const std::string& path, std::optional<hsize_t> steps_rows) {
  silence_hdf5_error_printing();
  errno = 0;
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (file.get() < 0) return "cannot be opened: " + hdf5_error_string();
  std::error_code size_error;
  const size_t file_bytes = std::filesystem::file_size(path, size_error);
  Visit visit{.file = file.get(), .steps_rows = steps_rows, .file_bytes = size_error ? 0 : file_bytes, .error = ""};
  visit.error = check_object(visit, ".");
  if (!visit.error.empty()) return visit.error;
  if (H5Lvisit(file.get(), H5_INDEX_NAME, H5_ITER_NATIVE, visit_link, &visit) < 0 && visit.error.empty())
    return "its groups: " + hdf5_error_string();
  return visit.error;
}

std::string mark_complete(const CompleteMarkArgs& args) {
  std::string error = read_back_error(args.partial, args.steps_rows);
  if (error.empty()) error = set_status(args.partial, "complete", "");
  if (error.empty()) error = durable_error(args.partial);
  if (error.empty()) error = read_back_error(args.partial, args.steps_rows);
  if (error.empty()) return give_final_name(args.partial, args.output) ? "" : "it stays " + args.partial;
  const std::string reason = "the file could not be marked complete: " + error;
  const std::string unmarked = set_status(args.partial, "failed", reason);
  if (!unmarked.empty()) {
    std::fprintf(stderr, "scalestudy: %s stays %s: %s, and it could not be marked failed (%s)\n",
                 args.output.c_str(), args.partial.c_str(), reason.c_str(), unmarked.c_str());
    return reason;
  }
  give_final_name(args.partial, args.output);
  return reason;
}

}  // namespace scalestudy
