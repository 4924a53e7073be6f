// Scalar attributes: UTF-8 variable-length strings (what h5py reads as str)
// and 64-bit integers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "formats/hdf5/hdf5_handle.h"

namespace ckpt::hdf5 {

void write_string_attribute(hid_t object, const std::string& name, const std::string& value);
void write_int_attribute(hid_t object, const std::string& name, int64_t value);
// nullopt when absent; DataLoss when present but not a string / integer.
std::optional<std::string> read_string_attribute(hid_t object, const std::string& name);
std::optional<int64_t> read_int_attribute(hid_t object, const std::string& name);

}  // namespace ckpt::hdf5
