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

// A sum of sizes for a report or a budget: past 2^64 it stays at the
// maximum, which any disk or budget it is checked against refuses (two
// tensors of 2^63 bytes summed to 0, and passed the free-space check).
inline uint64_t saturating_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

inline uint64_t saturating_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

// True when [offset, offset+length) lies inside [0, size).
inline bool range_fits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace ckpt
