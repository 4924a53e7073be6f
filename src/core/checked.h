// Checked integer arithmetic for sizes read from untrusted files: an overflow
// is corrupt input (DataLoss), never a wrap-around.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace ckpt {

inline uint64_t checked_add(uint64_t a, uint64_t b, const char* what = "size") {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail_data_loss(std::string(what) + " overflows 64 bits");
  return r;
}

inline uint64_t checked_mul(uint64_t a, uint64_t b, const char* what = "size") {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail_data_loss(std::string(what) + " overflows 64 bits");
  return r;
}

// True when [offset, offset+length) lies inside [0, size).
inline bool range_fits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace ckpt
