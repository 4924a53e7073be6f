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

// Rows [r0, r1) of the tensor (its first dimension; a 0-d tensor is one
// row) in row-major order, read through its chunks: of each chunk only the
// storage span of those rows, each run along the last dimension copied at
// once where the chunk's elements are adjacent there. Elements no chunk
// covers stay zero; a chunk outside the shape is an error.
std::vector<std::byte> row_block_bytes(const TensorEntry& t, int64_t r0, int64_t r1) {
  const std::size_t item = dtype_size(t.dtype);
  const Shape global = contiguous_strides(t.shape);
  const int64_t row_elems = t.shape.empty() ? 1 : (t.shape[0] ? int64_t(t.numel()) / t.shape[0] : 0);
  const int64_t block_elems = (r1 - r0) * row_elems;
  std::vector<std::byte> out(static_cast<std::size_t>(block_elems) * item, std::byte{0});
  for (const TensorChunk& c : t.chunks) {
    if (c.numel() == 0) continue;
    if (!c.storage) fail_data_loss(t.name + ": a chunk without storage");
    const std::size_t nd = c.sizes.size();
    // The chunk's rows inside [r0, r1), as indices into the chunk.
    int64_t a = 0, b = 1;
    if (nd > 0) {
      a = std::max<int64_t>(r0 - c.offsets[0], 0);
      b = std::min<int64_t>(r1 - c.offsets[0], c.sizes[0]);
      if (a >= b) continue;
    }
    Shape sizes = c.sizes;
    int64_t first = c.storage_offset;
    if (nd > 0) {
      sizes[0] = b - a;
      first += a * c.strides[0];
    }
    int64_t last = first;
    for (std::size_t d = 0; d < nd; ++d) last += (sizes[d] - 1) * c.strides[d];
    const std::vector<std::byte> span =
        c.storage->read_vector(uint64_t(first) * item, std::size_t(last - first + 1) * item);
    const int64_t run = nd ? sizes[nd - 1] : 1;
    const bool adjacent = nd == 0 || c.strides[nd - 1] == 1;
    Shape idx(nd, 0);
    for (uint64_t n = 0; n < uint64_t(shape_numel(sizes)); n += uint64_t(run)) {
      int64_t src = 0, dst = 0;
      for (std::size_t d = 0; d < nd; ++d) {
        src += idx[d] * c.strides[d];
        const int64_t at = c.offsets[d] + idx[d] + (d == 0 ? a - r0 : 0);
        if (at < 0 || (d > 0 && at + (d + 1 == nd ? run : 1) > t.shape[d]))
          fail_data_loss(t.name + ": a chunk outside the tensor's shape");
        dst += at * global[d];
      }
      if (dst < 0 || dst + run > block_elems) fail_data_loss(t.name + ": a chunk outside the tensor's shape");
      if (adjacent) {
        std::copy_n(span.begin() + src * int64_t(item), run * int64_t(item), out.begin() + dst * int64_t(item));
      } else {
        for (int64_t k = 0; k < run; ++k)
          std::copy_n(span.begin() + (src + k * c.strides[nd - 1]) * int64_t(item), item,
                      out.begin() + (dst + k) * int64_t(item));
      }
      for (std::size_t d = nd > 0 ? nd - 1 : 0; d-- > 0;) {  // the next run: the last dimension is the run
        if (++idx[d] < sizes[d]) break;
        idx[d] = 0;
      }
    }
  }
  return out;
}

}  // namespace

bool same_tensor_values(const TensorEntry& a, const TensorEntry& b) {
  if (a.dtype != b.dtype || a.shape != b.shape) return false;
  // Block by block of rows, about kCompareBlock bytes each (at least one
  // row), so comparing a tied embedding's copies holds two blocks, not two
  // whole tensors.
  const int64_t rows = a.shape.empty() ? 1 : a.shape[0];
  const uint64_t row_bytes = rows ? a.nbytes() / uint64_t(rows) : 0;
  const int64_t step = std::max<int64_t>(1, row_bytes ? int64_t(kCompareBlock / row_bytes) : rows);
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t end = std::min(rows, r + step);
    if (row_block_bytes(a, r, end) != row_block_bytes(b, r, end)) return false;
  }
  return true;
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
