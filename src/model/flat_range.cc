#include "model/flat_range.h"

#include <functional>

#include "core/error.h"
#include "io/byte_source.h"

namespace ckpt {
namespace {

// A flat 1-D partition record: one contiguous chunk.
const TensorChunk& flat_chunk(const TensorEntry& t, const std::string& what) {
  if (t.shape.size() != 1 || t.chunks.size() != 1 || t.chunks[0].strides != Shape{1})
    fail_data_loss(what + " is not a flat 1-D partition");
  return t.chunks[0];
}

}  // namespace

// Adds to `out` the chunks holding its flattened elements [begin, begin+n),
// read from `src` (a flat partition) starting at its element `src_elem`. A
// range of a row-major tensor is at most 2 x ndim boxes: a partial first
// row, whole rows, a partial last row, recursively.
void add_flat_range(TensorEntry& out, const TensorEntry& src, uint64_t src_elem, uint64_t begin, uint64_t n, int rank,
                    const std::string& what) {
  if (n == 0) return;
  const TensorChunk& sc = flat_chunk(src, what);
  if (src_elem > uint64_t(src.shape[0]) || n > uint64_t(src.shape[0]) - src_elem)
    fail_data_loss(what + ": needs elements [" + std::to_string(src_elem) + ", " + std::to_string(src_elem + n) +
                   ") of a partition of " + std::to_string(src.shape[0]));
  const Shape strides = contiguous_strides(out.shape);
  const int64_t base = sc.storage_offset + int64_t(src_elem) - int64_t(begin);
  auto emit = [&](const Shape& offsets, const Shape& sizes) {
    TensorChunk c;
    c.offsets = offsets;
    c.sizes = sizes;
    c.storage = sc.storage;
    c.strides = strides;
    int64_t flat = 0;
    for (std::size_t d = 0; d < offsets.size(); ++d) flat += offsets[d] * strides[d];
    c.storage_offset = base + flat;
    c.storage_crc = sc.storage_crc;
    c.record = sc.record;
    c.big_endian = sc.big_endian;
    c.file = sc.file;
    c.rank = rank;
    out.chunks.push_back(std::move(c));
  };
  // Recursive over dimensions: [lo, hi) within the sub-tensor at dim `d`
  // whose leading indices are `prefix`.
  std::function<void(std::size_t, Shape, uint64_t, uint64_t)> split = [&](std::size_t d, Shape prefix, uint64_t lo,
                                                                          uint64_t hi) {
    if (lo >= hi) return;
    const Shape& shape = out.shape;
    if (d == shape.size()) {  // a scalar (0-d tensor)
      emit(prefix, {});
      return;
    }
    uint64_t inner = 1;
    for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= uint64_t(shape[k]);
    Shape rest(shape.begin() + long(d) + 1, shape.end());
    auto box = [&](uint64_t r0, uint64_t r1) {
      Shape offsets = prefix, sizes(d, 1);
      offsets.push_back(int64_t(r0));
      offsets.resize(shape.size(), 0);
      sizes.push_back(int64_t(r1 - r0));
      sizes.insert(sizes.end(), rest.begin(), rest.end());
      emit(offsets, sizes);
    };
    uint64_t r_lo = lo / inner, r_hi = hi / inner;
    auto within = [&](uint64_t row, uint64_t a, uint64_t b) {
      Shape p = prefix;
      p.push_back(int64_t(row));
      split(d + 1, p, a, b);
    };
    if (r_lo == r_hi) {
      within(r_lo, lo % inner, hi % inner);
      return;
    }
    if (lo % inner) within(r_lo++, lo % inner, inner);
    if (r_hi > r_lo) box(r_lo, r_hi);
    if (hi % inner) within(r_hi, 0, hi % inner);
  };
  split(0, {}, begin, begin + n);
}

// Each box of `t` becomes the contiguous runs it is made of.
void append_flat(TensorEntry& out, const TensorEntry& t, uint64_t at) {
  const Shape gstrides = contiguous_strides(t.shape);
  const std::size_t nd = t.shape.size();
  for (const TensorChunk& c : t.chunks) {
    if (c.numel() == 0) continue;
    auto emit = [&](uint64_t global, int64_t storage, uint64_t n) {
      TensorChunk o = c;
      o.offsets = {int64_t(at + global)};
      o.sizes = {int64_t(n)};
      o.strides = {1};
      o.storage_offset = storage;
      out.chunks.push_back(std::move(o));
    };
    // Dims d.. of the box, the ones before fixed: one run when every later
    // dim is whole and the box is row-major in storage from d on.
    std::function<void(std::size_t, uint64_t, int64_t)> walk = [&](std::size_t d, uint64_t global, int64_t storage) {
      if (d == nd) return emit(global, storage, 1);
      bool run = true;
      int64_t expect = 1;
      for (std::size_t e = nd; e-- > d;) {
        if (e > d && (c.offsets[e] != 0 || c.sizes[e] != t.shape[e])) run = false;
        if (c.sizes[e] != 1 && c.strides[e] != expect) run = false;
        expect *= c.sizes[e];
      }
      if (run) {
        uint64_t n = 1;
        for (std::size_t e = d; e < nd; ++e) n *= uint64_t(c.sizes[e]);
        return emit(global + uint64_t(c.offsets[d] * gstrides[d]), storage, n);
      }
      for (int64_t i = 0; i < c.sizes[d]; ++i)
        walk(d + 1, global + uint64_t((c.offsets[d] + i) * gstrides[d]), storage + i * c.strides[d]);
    };
    walk(0, 0, c.storage_offset);
  }
}

void append_zeros(TensorEntry& out, uint64_t at, uint64_t n) {
  if (n == 0) return;
  TensorChunk z;
  z.offsets = {int64_t(at)};
  z.sizes = {int64_t(n)};
  z.strides = {1};
  z.storage = make_memory_source(std::string(n * dtype_size(out.dtype), '\0'), "<padding>");
  z.file = "<padding>";
  out.chunks.push_back(std::move(z));
}

}  // namespace ckpt
