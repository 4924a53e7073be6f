// Shared by the backend unit tests: slab jobs over in-memory tensors and a
// probe for whether the LibTorch plugin (needed for casts) is loadable.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "exec/backend.h"

namespace ckpt::testing {

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// A slab of `rows` rows read from a row-major buffer, cast to `to`.
inline SlabJob slab_of(const std::vector<std::byte>& src, DType from, DType to, int64_t rows, bool scan) {
  SlabJob job;
  job.dtype = from;
  job.out_dtype = to;
  job.rows = rows;
  job.row_elems = src.size() / dtype_size(from) / static_cast<std::size_t>(rows);
  std::size_t row_bytes = job.row_elems * dtype_size(from);
  const std::byte* base = src.data();
  job.gather = [base, row_bytes](int64_t r0, int64_t r1, std::byte* dst) {
    std::memcpy(dst, base + static_cast<std::size_t>(r0) * row_bytes, static_cast<std::size_t>(r1 - r0) * row_bytes);
  };
  job.scan = scan;
  return job;
}

inline std::vector<std::byte> copy_of(const SlabResult& r) { return {r.bytes.begin(), r.bytes.end()}; }

// Runs fn(); when it fails with the code that means "LibTorch or the device
// is not here", returns that message instead (the caller WARNs and skips).
template <typename Fn>
std::string unavailable_reason(Fn&& fn, ErrorCode code) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() == code) return e.what();
    throw;
  }
  return {};
}

}  // namespace ckpt::testing
