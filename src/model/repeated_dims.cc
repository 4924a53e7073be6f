#include "model/repeated_dims.h"

#include <algorithm>

namespace ckpt {

std::vector<std::size_t> repeated_dims(const TensorEntry& t) {
  std::vector<std::size_t> out;
  if (t.chunks.empty()) return out;
  const std::size_t rank = t.shape.size();
  for (std::size_t d = 0; d < rank; ++d) {
    if (t.shape[d] <= 1) continue;
    bool repeated = std::all_of(t.chunks.begin(), t.chunks.end(), [&](const TensorChunk& c) {
      return c.strides.size() == rank && c.offsets.size() == rank && c.sizes.size() == rank && c.strides[d] == 0 &&
             c.offsets[d] == 0 && c.sizes[d] == t.shape[d];
    });
    if (repeated) out.push_back(d);
  }
  return out;
}

TensorEntry without_dims(const TensorEntry& t, const std::vector<std::size_t>& dims) {
  TensorEntry out = t;
  for (auto d = dims.rbegin(); d != dims.rend(); ++d) {
    auto at = static_cast<std::ptrdiff_t>(*d);
    out.shape.erase(out.shape.begin() + at);
    for (TensorChunk& c : out.chunks)
      for (Shape* v : {&c.offsets, &c.sizes, &c.strides}) v->erase(v->begin() + at);
  }
  return out;
}

uint64_t repeat_count(const Shape& shape, const std::vector<std::size_t>& dims) {
  uint64_t n = 1;
  for (std::size_t d : dims) n *= static_cast<uint64_t>(shape[d]);
  return n;
}

uint64_t full_index(const Shape& shape, const std::vector<std::size_t>& dims, uint64_t reduced) {
  // Unravel `reduced` over the kept dimensions (last fastest), then ravel
  // over all of them with the removed ones at 0.
  std::vector<uint64_t> idx(shape.size(), 0);
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (std::binary_search(dims.begin(), dims.end(), d)) continue;
    auto n = static_cast<uint64_t>(shape[d]);
    idx[d] = reduced % n;
    reduced /= n;
  }
  uint64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * static_cast<uint64_t>(shape[d]) + idx[d];
  return flat;
}

}  // namespace ckpt
