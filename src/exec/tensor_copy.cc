#include "exec/tensor_copy.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace ckpt {
namespace {

// The two destinations of the one copy routine below.
class Destination {
 public:
  virtual ~Destination() = default;
  virtual void append(const void* data, std::size_t n) = 0;
  // `crc`: the CRC-32 of exactly these bytes when the source recorded it.
  virtual void append_from(const ByteSource& src, uint64_t pos, uint64_t n, std::optional<uint32_t> crc) = 0;
};

class ZipDestination final : public Destination {
 public:
  explicit ZipDestination(archive::ZipWriter& zip) : zip_(zip) {}
  void append(const void* data, std::size_t n) override { zip_.append(data, n); }
  void append_from(const ByteSource& src, uint64_t pos, uint64_t n, std::optional<uint32_t> crc) override {
    zip_.append_from(src, pos, n, crc);
  }

 private:
  archive::ZipWriter& zip_;
};

class SinkDestination final : public Destination {
 public:
  explicit SinkDestination(ByteSink& sink) : sink_(sink) {}
  void append(const void* data, std::size_t n) override { sink_.write(data, n); }
  void append_from(const ByteSource& src, uint64_t pos, uint64_t n, std::optional<uint32_t>) override {
    sink_.copy_from(src, pos, n);
  }

 private:
  ByteSink& sink_;
};

// True when the chunk spans every dimension but the first and its storage
// view is contiguous, so its bytes are one range of its storage.
bool is_contiguous_row_slab(const TensorEntry& t, const TensorChunk& c) {
  for (std::size_t d = 1; d < t.shape.size(); ++d)
    if (c.sizes[d] != t.shape[d]) return false;
  int64_t expect = 1;
  for (std::size_t d = c.sizes.size(); d-- > 0;) {
    if (c.sizes[d] == 1) continue;
    if (c.strides[d] != expect) return false;
    expect *= c.sizes[d];
  }
  return true;
}

std::vector<const TensorChunk*> nonempty_chunks(const TensorEntry& t) {
  std::vector<const TensorChunk*> out;
  for (const auto& c : t.chunks)
    if (c.numel() > 0) out.push_back(&c);
  std::sort(out.begin(), out.end(), [](const TensorChunk* a, const TensorChunk* b) {
    return a->offsets.empty() ? false : a->offsets[0] < b->offsets[0];
  });
  return out;
}

void append_slabs_direct(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks,
                         Destination& out) {
  std::size_t isz = dtype_size(t.dtype);
  for (const TensorChunk* c : chunks) {
    uint64_t n = c->numel() * isz;
    std::optional<uint32_t> crc;
    if (c->is_whole_contiguous_storage(isz)) crc = c->storage_crc;
    out.append_from(*c->storage, static_cast<uint64_t>(c->storage_offset) * isz, n, crc);
  }
}

// Storage bytes of a chunk: mapped when possible, else read into `scratch`.
const std::byte* storage_bytes(const TensorChunk& c, std::vector<std::byte>& scratch) {
  if (const std::byte* p = c.storage->data()) return p;
  scratch.resize(c.storage->size());
  c.storage->read(0, scratch.data(), scratch.size());
  return scratch.data();
}

// Writes a slab, cast to the output dtype when one is set.
void emit_slab(const TensorEntry& t, const std::vector<std::byte>& slab, std::vector<std::byte>& cast_buf,
               Destination& out, const CopyOptions& options) {
  if (!t.out_dtype || *t.out_dtype == t.dtype) {
    out.append(slab.data(), slab.size());
    return;
  }
  if (!options.backend) fail(ErrorCode::kInternal, "a dtype cast needs a backend");
  std::size_t n = slab.size() / dtype_size(t.dtype);
  cast_buf.resize(n * dtype_size(*t.out_dtype));
  options.backend->cast(slab.data(), t.dtype, cast_buf.data(), *t.out_dtype, n);
  out.append(cast_buf.data(), cast_buf.size());
}

// Copies the parts of `chunks` inside rows [r0, r1) of dim 0 into `dst`,
// which holds those rows contiguous and row-major.
void gather_rows(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks, int64_t r0, int64_t r1,
                 std::byte* dst, std::vector<std::byte>& scratch) {
  std::size_t isz = dtype_size(t.dtype);
  Shape out_strides = contiguous_strides(t.shape);
  for (const TensorChunk* c : chunks) {
    int64_t lo = std::max(r0, c->offsets[0]), hi = std::min(r1, c->offsets[0] + c->sizes[0]);
    if (lo >= hi) continue;
    Shape extent = c->sizes;
    extent[0] = hi - lo;
    const std::byte* src = storage_bytes(*c, scratch) +
                           (c->storage_offset + (lo - c->offsets[0]) * c->strides[0]) * static_cast<int64_t>(isz);
    int64_t dst_elem = (lo - r0) * out_strides[0];
    for (std::size_t d = 1; d < t.shape.size(); ++d) dst_elem += c->offsets[d] * out_strides[d];
    copy_box(src, c->strides, dst + dst_elem * static_cast<int64_t>(isz), out_strides, extent, isz);
  }
}

void append_slabs_gathered(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks,
                           Destination& out, const CopyOptions& options) {
  std::size_t isz = dtype_size(t.dtype);
  Shape row_shape(t.shape.begin() + 1, t.shape.end());
  uint64_t row_bytes = shape_numel(row_shape) * isz;
  // The slab and its cast copy share the budget.
  uint64_t per_row = row_bytes + shape_numel(row_shape) * dtype_size(t.output_dtype());
  int64_t rows_per_slab = std::max<int64_t>(1, static_cast<int64_t>(options.memory_limit / std::max<uint64_t>(per_row, 1)));
  std::vector<std::byte> slab, scratch, cast_buf;
  for (int64_t r0 = 0; r0 < t.shape[0]; r0 += rows_per_slab) {
    int64_t r1 = std::min(t.shape[0], r0 + rows_per_slab);
    slab.assign(static_cast<std::size_t>((r1 - r0) * row_bytes), std::byte{0});
    gather_rows(t, chunks, r0, r1, slab.data(), scratch);
    emit_slab(t, slab, cast_buf, out, options);
  }
}

}  // namespace

void copy_box(const std::byte* src, const Shape& src_strides, std::byte* dst, const Shape& dst_strides,
              const Shape& extent, std::size_t itemsize) {
  std::size_t rank = extent.size();
  if (rank == 0) {
    std::memcpy(dst, src, itemsize);
    return;
  }
  // Innermost run: one memcpy when both sides are contiguous along the last dimension.
  bool inner_contiguous = src_strides[rank - 1] == 1 && dst_strides[rank - 1] == 1;
  std::vector<int64_t> idx(rank, 0);
  int64_t inner = extent[rank - 1];
  for (int64_t d : extent)
    if (d == 0) return;
  while (true) {
    int64_t s = 0, o = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) {
      s += idx[d] * src_strides[d];
      o += idx[d] * dst_strides[d];
    }
    if (inner_contiguous) {
      std::memcpy(dst + o * int64_t(itemsize), src + s * int64_t(itemsize), static_cast<std::size_t>(inner) * itemsize);
    } else {
      for (int64_t i = 0; i < inner; ++i)
        std::memcpy(dst + (o + i * dst_strides[rank - 1]) * int64_t(itemsize),
                    src + (s + i * src_strides[rank - 1]) * int64_t(itemsize), itemsize);
    }
    std::size_t d = rank - 1;
    while (d-- > 0) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

namespace {

void append_tensor_to(const TensorEntry& t, Destination& out, const CopyOptions& options) {
  with_context("tensor '" + t.name + "'", [&] {
    auto chunks = nonempty_chunks(t);
    if (t.numel() == 0) return;
    bool direct = std::all_of(chunks.begin(), chunks.end(),
                              [&](const TensorChunk* c) { return is_contiguous_row_slab(t, *c); });
    bool cast = t.out_dtype && *t.out_dtype != t.dtype;
    if ((direct || t.shape.empty()) && !cast) {
      append_slabs_direct(t, chunks, out);
    } else if (t.shape.empty()) {
      // A 0-dim tensor: one element, gathered as a one-row slab.
      std::vector<std::byte> one(dtype_size(t.dtype)), cast_buf, scratch;
      const TensorChunk& c = *chunks.at(0);
      std::memcpy(one.data(), storage_bytes(c, scratch) + c.storage_offset * int64_t(one.size()), one.size());
      emit_slab(t, one, cast_buf, out, options);
    } else {
      append_slabs_gathered(t, chunks, out, options);
    }
    // Bytes read through a mapping count in our RSS until released; one
    // tensor's sources at a time keeps peak memory independent of the
    // checkpoint's size.
    for (const TensorChunk* c : chunks) c->storage->release(0, c->storage->size());
  });
}

}  // namespace

void assemble_rows(const TensorEntry& t, int64_t r0, int64_t r1, std::byte* dst) {
  with_context("tensor '" + t.name + "'", [&] {
    auto chunks = nonempty_chunks(t);
    std::vector<std::byte> scratch;
    if (t.shape.empty()) {
      if (r0 != 0 || r1 != 1) fail(ErrorCode::kInternal, "a 0-dim tensor has exactly one row");
      if (chunks.empty()) fail(ErrorCode::kDataLoss, "a 0-dim tensor without bytes");
      const TensorChunk& c = *chunks.front();
      std::size_t isz = dtype_size(t.dtype);
      std::memcpy(dst, storage_bytes(c, scratch) + c.storage_offset * static_cast<int64_t>(isz), isz);
      return;
    }
    if (r0 < 0 || r1 > t.shape[0] || r0 > r1) fail(ErrorCode::kInternal, "rows outside the tensor");
    gather_rows(t, chunks, r0, r1, dst, scratch);
  });
}

void append_tensor(const TensorEntry& t, archive::ZipWriter& zip, const CopyOptions& options) {
  ZipDestination dest(zip);
  append_tensor_to(t, dest, options);
}

void append_tensor(const TensorEntry& t, ByteSink& sink, const CopyOptions& options) {
  SinkDestination dest(sink);
  append_tensor_to(t, dest, options);
}

}  // namespace ckpt
