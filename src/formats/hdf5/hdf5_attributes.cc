#include "formats/hdf5/hdf5_attributes.h"

#include <vector>

namespace ckpt::hdf5 {
namespace {

Handle utf8_string_type() {
  Handle t = checked_handle(H5Tcopy(H5T_C_S1), ErrorCode::kInternal, "string type");
  check(H5Tset_size(t, H5T_VARIABLE), ErrorCode::kInternal, "string type");
  check(H5Tset_cset(t, H5T_CSET_UTF8), ErrorCode::kInternal, "string type");
  return t;
}

Handle scalar_space() { return checked_handle(H5Screate(H5S_SCALAR), ErrorCode::kInternal, "dataspace"); }

}  // namespace

void write_string_attribute(hid_t object, const std::string& name, const std::string& value) {
  std::string what = "attribute '" + name + "'";
  Handle type = utf8_string_type();
  Handle space = scalar_space();
  Handle attr = checked_handle(H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT),
                               ErrorCode::kOutputFailed, what);
  const char* p = value.c_str();
  check(H5Awrite(attr, type, &p), ErrorCode::kOutputFailed, what);
}

void write_int_attribute(hid_t object, const std::string& name, int64_t value) {
  std::string what = "attribute '" + name + "'";
  Handle space = scalar_space();
  Handle attr = checked_handle(H5Acreate2(object, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT),
                               ErrorCode::kOutputFailed, what);
  check(H5Awrite(attr, H5T_NATIVE_INT64, &value), ErrorCode::kOutputFailed, what);
}

std::optional<std::string> read_string_attribute(hid_t object, const std::string& name) {
  std::string what = "attribute '" + name + "'";
  if (check(H5Aexists(object, name.c_str()), ErrorCode::kDataLoss, what) == 0) return std::nullopt;
  Handle attr = checked_handle(H5Aopen(object, name.c_str(), H5P_DEFAULT), ErrorCode::kDataLoss, what);
  Handle ftype = checked_handle(H5Aget_type(attr), ErrorCode::kDataLoss, what);
  if (H5Tget_class(ftype) != H5T_STRING) fail_data_loss(what + " is not a string");
  Handle space = checked_handle(H5Aget_space(attr), ErrorCode::kDataLoss, what);
  if (H5Sget_simple_extent_npoints(space) != 1) fail_data_loss(what + " is not a scalar");
  if (H5Tis_variable_str(ftype) > 0) {
    Handle mtype = utf8_string_type();
    char* p = nullptr;
    check(H5Aread(attr, mtype, &p), ErrorCode::kDataLoss, what);
    std::string out = p ? p : "";
    H5free_memory(p);
    return out;
  }
  // A fixed-size string's length comes from the file: a flipped bit can claim
  // gigabytes. No attribute can hold more than the file's own bytes.
  std::size_t n = H5Tget_size(ftype);
  Handle file = checked_handle(H5Iget_file_id(attr), ErrorCode::kDataLoss, what);
  hsize_t file_size = 0;
  check(H5Fget_filesize(file, &file_size), ErrorCode::kDataLoss, what);
  if (n > file_size)
    fail_data_loss(what + " claims a string of " + std::to_string(n) + " bytes, more than the " +
                   std::to_string(file_size) + " bytes of its file");
  std::vector<char> buf(n + 1, '\0');
  check(H5Aread(attr, ftype, buf.data()), ErrorCode::kDataLoss, what);
  return std::string(buf.data());
}

std::optional<int64_t> read_int_attribute(hid_t object, const std::string& name) {
  std::string what = "attribute '" + name + "'";
  if (check(H5Aexists(object, name.c_str()), ErrorCode::kDataLoss, what) == 0) return std::nullopt;
  Handle attr = checked_handle(H5Aopen(object, name.c_str(), H5P_DEFAULT), ErrorCode::kDataLoss, what);
  Handle ftype = checked_handle(H5Aget_type(attr), ErrorCode::kDataLoss, what);
  if (H5Tget_class(ftype) != H5T_INTEGER) fail_data_loss(what + " is not an integer");
  int64_t v = 0;
  check(H5Aread(attr, H5T_NATIVE_INT64, &v), ErrorCode::kDataLoss, what);
  return v;
}

}  // namespace ckpt::hdf5
