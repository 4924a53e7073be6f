#include "formats/hdf5/hdf5_handle.h"

#include <mutex>

namespace ckpt::hdf5 {

void silence_hdf5_errors() {
  static std::once_flag once;
  std::call_once(once, [] {
    // No atexit clean-up: after a failed write (disk full) HDF5 1.10 keeps the
    // file open and its clean-up at exit crashes closing it. We close every
    // file we open ourselves; a failed output is a temp file we delete.
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  });
}

std::string hdf5_error_text(bool* out_of_memory) {
  struct Walk {
    std::string text;
    bool out_of_memory = false;
  } walk;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
        auto* w = static_cast<Walk*>(data);
        // "No space available for allocation": H5MM's failed malloc
        if (err->min_num == H5E_NOSPACE) w->out_of_memory = true;
        if (n < 2 && err->desc && *err->desc) {
          if (!w->text.empty()) w->text += ": ";
          w->text += err->desc;
        }
        return 0;
      },
      &walk);
  H5Eclear2(H5E_DEFAULT);
  if (out_of_memory) *out_of_memory = walk.out_of_memory;
  return walk.text.empty() ? "HDF5 call failed" : walk.text;
}

herr_t Handle::reset() {
  if (id_ < 0) return 0;
  hid_t id = std::exchange(id_, H5I_INVALID_HID);
  switch (H5Iget_type(id)) {
    case H5I_FILE: return H5Fclose(id);
    case H5I_GROUP: return H5Gclose(id);
    case H5I_DATASET: return H5Dclose(id);
    case H5I_DATASPACE: return H5Sclose(id);
    case H5I_DATATYPE: return H5Tclose(id);
    case H5I_ATTR: return H5Aclose(id);
    case H5I_GENPROP_LST: return H5Pclose(id);
    default: return H5Idec_ref(id);
  }
}

std::string escape_name(const std::string& key) {
  if (key == ".") return "%2E";
  if (key.empty()) return "%00";
  std::string out;
  for (char c : key) {
    if (c == '%')
      out += "%25";
    else if (c == '/')
      out += "%2F";
    else if (c == '\0')  // HDF5 takes a C string: the name would end there
      out += "%00";
    else
      out += c;
  }
  return out;
}

}  // namespace ckpt::hdf5
