// RAII for HDF5 identifiers and the translation of HDF5's error stack into
// ckpt::Error. silence_hdf5_errors() must precede any other HDF5 call: it
// switches off HDF5's automatic error printing (failures are reported by us,
// with the object's name) and its atexit clean-up.
#pragma once

#include <hdf5.h>

#include <new>
#include <string>
#include <utility>

#include "core/error.h"

namespace ckpt::hdf5 {

void silence_hdf5_errors();

// The innermost messages of HDF5's current error stack ("unable to open
// file: ..."), then clears it. `out_of_memory`: whether libhdf5 failed
// because an allocation of memory failed, anywhere in the stack.
std::string hdf5_error_text(bool* out_of_memory = nullptr);

// Throws `code` with "<what>: <HDF5's reason>" when `status` is negative.
// A failure to allocate memory is std::bad_alloc, as in our own code: in the
// reader's child that is the hdf5-memory cap, and the child reports it as
// that budget, not as "datatype conversion failed" (a 30 KB mutant whose
// string attribute claims 7.5 GB).
template <class T>
T check(T status, ErrorCode code, const std::string& what) {
  if (status < 0) {
    bool out_of_memory = false;
    std::string text = hdf5_error_text(&out_of_memory);
    if (out_of_memory) throw std::bad_alloc();
    fail(code, what + ": " + text);
  }
  return status;
}

// Owns one hid_t; closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: handles pass straight to the C API
  // Closes now; returns H5*close's status (negative on failure).
  herr_t reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Handle::reset for an id that failed to open: checked.
inline Handle checked_handle(hid_t id, ErrorCode code, const std::string& what) {
  return Handle(check(id, code, what));
}

// The link or attribute name of a key (docs/hdf5-layout.md): '%' and '/'
// percent-encoded ("%25", "%2F"), a key "." as "%2E", an empty key as "%00".
std::string escape_name(const std::string& key);

inline constexpr int kLayoutVersion = 1;

}  // namespace ckpt::hdf5
