#include "model/tensor_compare.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace ckpt {
namespace {

constexpr std::size_t kCompareBlock = std::size_t{1} << 20;

bool is_row_major(const TensorChunk& c) {
  if (c.numel() <= 1) return true;
  int64_t expect = 1;
  for (std::size_t i = c.sizes.size(); i-- > 0;) {
    if (c.sizes[i] == 1) continue;
    if (c.strides[i] != expect) return false;
    expect *= c.sizes[i];
  }
  return true;
}

// Byte offset in the storage of each element, row-major; for the rare
// non-contiguous plain tensor.
std::vector<uint64_t> element_offsets(const TensorChunk& c, std::size_t itemsize) {
  std::vector<uint64_t> out;
  out.reserve(static_cast<std::size_t>(c.numel()));
  Shape idx(c.sizes.size(), 0);
  for (uint64_t n = 0; n < c.numel(); ++n) {
    int64_t e = c.storage_offset;
    for (std::size_t d = 0; d < idx.size(); ++d) e += idx[d] * c.strides[d];
    out.push_back(static_cast<uint64_t>(e) * itemsize);
    for (std::size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < c.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// The tensor's elements in row-major order of its global shape, read
// through its chunks (each chunk's storage span read once); elements no
// chunk covers stay zero, and a chunk outside the shape is an error.
std::vector<std::byte> row_major_bytes(const TensorEntry& t) {
  const std::size_t item = dtype_size(t.dtype);
  std::vector<std::byte> out(static_cast<std::size_t>(t.nbytes()), std::byte{0});
  const Shape global = contiguous_strides(t.shape);
  for (const TensorChunk& c : t.chunks) {
    if (c.numel() == 0) continue;
    if (!c.storage) fail_data_loss(t.name + ": a chunk without storage");
    int64_t last = c.storage_offset;
    for (std::size_t d = 0; d < c.sizes.size(); ++d) last += (c.sizes[d] - 1) * c.strides[d];
    const std::vector<std::byte> span =
        c.storage->read_vector(uint64_t(c.storage_offset) * item, std::size_t(last - c.storage_offset + 1) * item);
    Shape idx(c.sizes.size(), 0);
    for (uint64_t n = 0; n < c.numel(); ++n) {
      int64_t src = 0, dst = 0;
      for (std::size_t d = 0; d < idx.size(); ++d) {
        src += idx[d] * c.strides[d];
        dst += (c.offsets[d] + idx[d]) * global[d];
      }
      if (dst < 0 || uint64_t(dst) >= t.numel()) fail_data_loss(t.name + ": a chunk outside the tensor's shape");
      std::copy_n(span.begin() + src * int64_t(item), item, out.begin() + dst * int64_t(item));
      for (std::size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < c.sizes[d]) break;
        idx[d] = 0;
      }
    }
  }
  return out;
}

}  // namespace

bool same_tensor_values(const TensorEntry& a, const TensorEntry& b) {
  if (a.dtype != b.dtype || a.shape != b.shape) return false;
  return row_major_bytes(a) == row_major_bytes(b);
}

bool same_tensor_bytes(const TensorEntry& a, const TensorEntry& b) {
  if (a.dtype != b.dtype || a.shape != b.shape || a.chunks.size() != 1 || b.chunks.size() != 1) return false;
  const TensorChunk& ca = a.chunks[0];
  const TensorChunk& cb = b.chunks[0];
  std::size_t item = dtype_size(a.dtype);
  uint64_t nbytes = a.nbytes();
  if (nbytes == 0) return true;
  if (!ca.storage || !cb.storage) return false;
  if (is_row_major(ca) && is_row_major(cb)) {
    uint64_t pa = static_cast<uint64_t>(ca.storage_offset) * item, pb = static_cast<uint64_t>(cb.storage_offset) * item;
    for (uint64_t done = 0; done < nbytes;) {
      std::size_t n = static_cast<std::size_t>(std::min<uint64_t>(kCompareBlock, nbytes - done));
      if (ca.storage->read_vector(pa + done, n) != cb.storage->read_vector(pb + done, n)) return false;
      done += n;
    }
    return true;
  }
  auto oa = element_offsets(ca, item), ob = element_offsets(cb, item);
  for (std::size_t i = 0; i < oa.size(); ++i)
    if (ca.storage->read_vector(oa[i], item) != cb.storage->read_vector(ob[i], item)) return false;
  return true;
}

}  // namespace ckpt
