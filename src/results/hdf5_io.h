#pragma once
// Small RAII helpers over the HDF5 C API: typed attributes, string lists and datasets
// that grow along their first axis. Every call is checked with CHECK_HDF5.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace scalestudy::h5 {

// Owns one HDF5 identifier and closes it with the right H5*close.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(other.id_) { other.id_ = -1; }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  void reset();

 private:
  hid_t id_ = -1;
};

Handle create_group(hid_t parent, const std::string& name);

void set_attribute(hid_t object, const std::string& name, const std::string& value);
void set_attribute(hid_t object, const std::string& name, const char* value);
// The same as a string attribute, without the check: false where it could not be written.
bool try_set_attribute(hid_t object, const std::string& name, const std::string& value);
void set_attribute(hid_t object, const std::string& name, int64_t value);
void set_attribute(hid_t object, const std::string& name, double value);
void set_attribute(hid_t object, const std::string& name, const std::vector<std::string>& values);
// A 1-D int64 attribute.
void set_attribute(hid_t object, const std::string& name, const std::vector<int64_t>& values);

// A fixed-size 1-D dataset of variable-length strings.
void write_strings(hid_t parent, const std::string& name, const std::vector<std::string>& values);
// A fixed-size dataset of the given shape: file_type as stored (H5T_STD_*LE,
// H5T_IEEE_*LE), memory_type what data holds (H5T_NATIVE_*), row-major.
void write_array(hid_t parent, const std::string& name, hid_t file_type, hid_t memory_type,
                 const std::vector<hsize_t>& shape, const void* data);
// A fixed-size dataset of int64 with the given shape.
void write_int64(hid_t parent, const std::string& name, const std::vector<hsize_t>& shape,
                 const std::vector<int64_t>& values);

// A chunked dataset whose first axis grows as rows are appended.
class GrowingDataset {
 public:
  // row_shape: the shape of one row (empty for a scalar per row); type: H5T_NATIVE_*.
  GrowingDataset(hid_t parent, const std::string& name, hid_t type, std::vector<hsize_t> row_shape,
                 hsize_t chunk_rows);
  // Appends rows; data holds rows * product(row_shape) elements of the dataset's type.
  void append(const void* data, hsize_t rows);
  hid_t id() const { return dataset_.get(); }
  hsize_t rows() const { return rows_; }

 private:
  Handle dataset_;
  hid_t type_;
  std::vector<hsize_t> row_shape_;
  hsize_t rows_ = 0;
};

}  // namespace scalestudy::h5
