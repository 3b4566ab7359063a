#include "results/hdf5_io.h"

#include "results/hdf5_check.h"

namespace scalestudy::h5 {
namespace {

Handle utf8_string_type() {
  Handle type(CHECK_HDF5(H5Tcopy(H5T_C_S1)));
  CHECK_HDF5(H5Tset_size(type.get(), H5T_VARIABLE));
  CHECK_HDF5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  return type;
}

void replace_attribute(hid_t object, const std::string& name) {
  if (CHECK_HDF5(H5Aexists(object, name.c_str())) > 0) CHECK_HDF5(H5Adelete(object, name.c_str()));
}

void write_scalar_attribute(hid_t object, const std::string& name, hid_t file_type, hid_t memory_type,
                            const void* value) {
  replace_attribute(object, name);
  Handle space(CHECK_HDF5(H5Screate(H5S_SCALAR)));
  Handle attribute(CHECK_HDF5(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  CHECK_HDF5(H5Awrite(attribute.get(), memory_type, value));
}

std::vector<const char*> c_strings(const std::vector<std::string>& values) {
  std::vector<const char*> out;
  out.reserve(values.size());
  for (const auto& value : values) out.push_back(value.c_str());
  return out;
}

}  // namespace

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    other.id_ = -1;
  }
  return *this;
}

void Handle::reset() {
  if (id_ < 0) return;
  // Closing is not worth aborting the job over: its failure cannot lose data already
  // flushed, and this runs during unwinding.
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = -1;
}

Handle create_group(hid_t parent, const std::string& name) {
  return Handle(CHECK_HDF5(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
}

void set_attribute(hid_t object, const std::string& name, const std::string& value) {
  Handle type = utf8_string_type();
  const char* text = value.c_str();
  write_scalar_attribute(object, name, type.get(), type.get(), &text);
}

bool try_set_attribute(hid_t object, const std::string& name, const std::string& value) {
  // Unchecked: this runs where the file may no longer be writable (a full disk), and a
  // failure must not end the job before the file is closed and renamed.
  const hid_t type = H5Tcopy(H5T_C_S1);
  if (type < 0) return false;
  bool written = H5Tset_size(type, H5T_VARIABLE) >= 0 && H5Tset_cset(type, H5T_CSET_UTF8) >= 0;
  if (written && H5Aexists(object, name.c_str()) > 0) written = H5Adelete(object, name.c_str()) >= 0;
  const hid_t space = written ? H5Screate(H5S_SCALAR) : -1;
  const hid_t attribute = space >= 0 ? H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT) : -1;
  const char* text = value.c_str();
  written = attribute >= 0 && H5Awrite(attribute, type, &text) >= 0;
  if (attribute >= 0) H5Aclose(attribute);
  if (space >= 0) H5Sclose(space);
  H5Tclose(type);
  return written;
}

void set_attribute(hid_t object, const std::string& name, const char* value) {
  set_attribute(object, name, std::string(value));
}

void set_attribute(hid_t object, const std::string& name, int64_t value) {
  write_scalar_attribute(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void set_attribute(hid_t object, const std::string& name, double value) {
  write_scalar_attribute(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void set_attribute(hid_t object, const std::string& name, const std::vector<int64_t>& values) {
  replace_attribute(object, name);
  const hsize_t count = values.size();
  Handle space(CHECK_HDF5(H5Screate_simple(1, &count, nullptr)));
  Handle attribute(
      CHECK_HDF5(H5Acreate2(object, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  CHECK_HDF5(H5Awrite(attribute.get(), H5T_NATIVE_INT64, values.data()));
}

void set_attribute(hid_t object, const std::string& name, const std::vector<std::string>& values) {
  replace_attribute(object, name);
  Handle type = utf8_string_type();
  const hsize_t count = values.size();
  Handle space(CHECK_HDF5(H5Screate_simple(1, &count, nullptr)));
  Handle attribute(CHECK_HDF5(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  const std::vector<const char*> text = c_strings(values);
  CHECK_HDF5(H5Awrite(attribute.get(), type.get(), text.data()));
}

void write_strings(hid_t parent, const std::string& name, const std::vector<std::string>& values) {
  Handle type = utf8_string_type();
  const hsize_t count = values.size();
  Handle space(CHECK_HDF5(H5Screate_simple(1, &count, nullptr)));
  Handle dataset(CHECK_HDF5(
      H5Dcreate2(parent, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  const std::vector<const char*> text = c_strings(values);
  if (count > 0) CHECK_HDF5(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()));
}

void write_array(hid_t parent, const std::string& name, hid_t file_type, hid_t memory_type,
                 const std::vector<hsize_t>& shape, const void* data) {
  Handle space(CHECK_HDF5(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr)));
  Handle dataset(CHECK_HDF5(
      H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  hsize_t elems = 1;
  for (hsize_t extent : shape) elems *= extent;
  // HDF5 refuses a null buffer even for an empty write.
  if (elems > 0) CHECK_HDF5(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void write_int64(hid_t parent, const std::string& name, const std::vector<hsize_t>& shape,
                 const std::vector<int64_t>& values) {
  write_array(parent, name, H5T_STD_I64LE, H5T_NATIVE_INT64, shape, values.data());
}

GrowingDataset::GrowingDataset(hid_t parent, const std::string& name, hid_t type, std::vector<hsize_t> row_shape,
                               hsize_t chunk_rows)
    : type_(type), row_shape_(std::move(row_shape)) {
  std::vector<hsize_t> dims = {0}, max_dims = {H5S_UNLIMITED}, chunk = {chunk_rows};
  for (hsize_t extent : row_shape_) {
    dims.push_back(extent);
    max_dims.push_back(extent);
    chunk.push_back(extent);
  }
  Handle space(CHECK_HDF5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data())));
  Handle properties(CHECK_HDF5(H5Pcreate(H5P_DATASET_CREATE)));
  CHECK_HDF5(H5Pset_chunk(properties.get(), static_cast<int>(chunk.size()), chunk.data()));
  // Stored little-endian whatever the host, as the schema says.
  hid_t file_type = type;
  if (H5Tequal(type, H5T_NATIVE_DOUBLE) > 0) file_type = H5T_IEEE_F64LE;
  else if (H5Tequal(type, H5T_NATIVE_INT64) > 0) file_type = H5T_STD_I64LE;
  else if (H5Tequal(type, H5T_NATIVE_INT32) > 0) file_type = H5T_STD_I32LE;
  else if (H5Tequal(type, H5T_NATIVE_UINT8) > 0) file_type = H5T_STD_U8LE;
  dataset_ = Handle(CHECK_HDF5(
      H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT, properties.get(), H5P_DEFAULT)));
}

void GrowingDataset::append(const void* data, hsize_t rows) {
  if (rows == 0) return;
  std::vector<hsize_t> new_dims = {rows_ + rows}, start = {rows_}, count = {rows};
  for (hsize_t extent : row_shape_) {
    new_dims.push_back(extent);
    start.push_back(0);
    count.push_back(extent);
  }
  CHECK_HDF5(H5Dset_extent(dataset_.get(), new_dims.data()));
  Handle file_space(CHECK_HDF5(H5Dget_space(dataset_.get())));
  CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
  Handle memory_space(CHECK_HDF5(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)));
  CHECK_HDF5(H5Dwrite(dataset_.get(), type_, memory_space.get(), file_space.get(), H5P_DEFAULT, data));
  rows_ += rows;
}

}  // namespace scalestudy::h5
