#include "exec/tensor_copy.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/progress.h"

namespace ckpt {
namespace {

// The two destinations of the one copy routine below. Every byte written
// passes here, so this is where progress is counted (per slab or chunk, not
// per tensor, so that one large tensor still moves the line).
class Destination {
 public:
  virtual ~Destination() = default;
  void append(const void* data, std::size_t n) {
    do_append(data, n, std::nullopt);
    progress_add(n);
  }
  // `crc`: the CRC-32 of exactly these bytes when the backend summed it.
  void append(const void* data, std::size_t n, std::optional<uint32_t> crc) {
    do_append(data, n, crc);
    progress_add(n);
  }
  // Whether a CRC-32 of the appended bytes is wanted (a zip record's).
  // A destination that wants it also sums what append_from copies.
  virtual bool wants_crc() const { return false; }
  // `crc`: the CRC-32 of exactly these bytes when the source recorded it.
  // `crc_out`, when given and the destination sums what it copies (a zip
  // record), receives the CRC-32 of these bytes; else it is left alone.
  void append_from(const ByteSource& src, uint64_t pos, uint64_t n, std::optional<uint32_t> crc,
                   uint32_t* crc_out = nullptr) {
    do_append_from(src, pos, n, crc, crc_out);
    progress_add(n);
  }

 private:
  virtual void do_append(const void* data, std::size_t n, std::optional<uint32_t> crc) = 0;
  virtual void do_append_from(const ByteSource& src, uint64_t pos, uint64_t n, std::optional<uint32_t> crc,
                              uint32_t* crc_out) = 0;
};

class ZipDestination final : public Destination {
 public:
  explicit ZipDestination(archive::ZipWriter& zip) : zip_(zip) {}
  bool wants_crc() const override { return true; }

 private:
  void do_append(const void* data, std::size_t n, std::optional<uint32_t> crc) override {
    if (crc)
      zip_.append(data, n, *crc);
    else
      zip_.append(data, n);
  }
  void do_append_from(const ByteSource& src, uint64_t pos, uint64_t n, std::optional<uint32_t> crc,
                      uint32_t* crc_out) override {
    zip_.append_from(src, pos, n, crc, crc_out);
  }

  archive::ZipWriter& zip_;
};

class SinkDestination final : public Destination {
 public:
  explicit SinkDestination(ByteSink& sink) : sink_(sink) {}

 private:
  void do_append(const void* data, std::size_t n, std::optional<uint32_t>) override { sink_.write(data, n); }
  void do_append_from(const ByteSource& src, uint64_t pos, uint64_t n, std::optional<uint32_t>,
                      uint32_t* crc_out) override {
    if (crc_out)
      *crc_out = archive::copy_summing(src, pos, n, sink_);
    else
      sink_.copy_from(src, pos, n);
  }

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

// `parts`: chunks whose record's CRC-32 is summed from the parts copied
// (RecordVerifier::add_piece) rather than checked apart.
void append_slabs_direct(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks, Destination& out,
                         const std::vector<const TensorChunk*>& parts, RecordVerifier* verifier) {
  std::size_t isz = dtype_size(t.dtype);
  for (const TensorChunk* c : chunks) {
    uint64_t n = c->numel() * isz;
    uint64_t pos = static_cast<uint64_t>(c->storage_offset) * isz;
    bool summed = std::find(parts.begin(), parts.end(), c) != parts.end();
    std::optional<uint32_t> crc;  // a summed chunk's CRC-32 is computed, never taken from the record
    if (c->is_whole_contiguous_storage(isz) && !summed) crc = c->storage_crc;
    uint32_t piece = 0;
    out.append_from(*c->storage, pos, n, crc, summed ? &piece : nullptr);
    if (summed) verifier->add_piece(*c, t.name, pos, n, piece);
  }
}

// The source bytes of a box of chunk `c` whose first element is storage
// element `first` (strides are non-negative): a pointer into the mapping, or
// just the box's byte span read into `scratch` when the source is not mapped.
const std::byte* box_source(const TensorChunk& c, int64_t first, const Shape& extent, std::size_t isz,
                            std::vector<std::byte>& scratch) {
  if (const std::byte* p = c.storage->data()) return p + first * static_cast<int64_t>(isz);
  int64_t span = 1;
  for (std::size_t d = 0; d < extent.size(); ++d) span += (extent[d] - 1) * c.strides[d];
  scratch.resize(static_cast<std::size_t>(span) * isz);
  c.storage->read(static_cast<uint64_t>(first) * isz, scratch.data(), scratch.size());
  return scratch.data();
}

// Reverses the bytes of each of n elements of `dtype` at p, in place: a
// complex element is two floats, each swapped; one-byte types are left.
void swap_elements(std::byte* p, std::size_t n, DType dtype) {
  std::size_t unit = dtype_size(dtype), count = n;
  if (dtype_info(dtype).is_complex) {
    unit /= 2;
    count *= 2;
  }
  if (unit <= 1) return;
  for (std::size_t i = 0; i < count; ++i) std::reverse(p + i * unit, p + (i + 1) * unit);
}

// swap_elements over the box `extent` of a contiguous row-major `dst`
// (strides `dst_strides`, the last 1): one run per innermost row.
void swap_box(std::byte* dst, const Shape& dst_strides, const Shape& extent, DType dtype) {
  std::size_t rank = extent.size(), isz = dtype_size(dtype);
  if (rank == 0) return swap_elements(dst, 1, dtype);
  for (int64_t d : extent)
    if (d == 0) return;
  std::vector<int64_t> idx(rank, 0);
  while (true) {
    int64_t o = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) o += idx[d] * dst_strides[d];
    swap_elements(dst + o * static_cast<int64_t>(isz), static_cast<std::size_t>(extent[rank - 1]), dtype);
    std::size_t d = rank - 1;
    while (d-- > 0) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
    if (d == static_cast<std::size_t>(-1)) return;
  }
}

// The CRC-32 of a record summed while its bytes are gathered: each worker
// sums the byte range it copied (still in its cache) and the pieces are
// joined in order with crc32_combine once the tensor is done, so checking
// the record costs no read of its own (the check beside the copy read the
// bytes a second time: 1.27x a consolidate, 1.55x with --dtype bf16).
// For the chunks that are whole records laid out as rows (sum_chunks).
class PieceCrcs {
 public:
  explicit PieceCrcs(const std::vector<const TensorChunk*>& chunks) : chunks_(chunks.begin(), chunks.end()) {}
  bool covers(const TensorChunk* c) const { return chunks_.count(c) > 0; }
  void add(const TensorChunk* c, uint64_t offset, const std::byte* bytes, uint64_t n) {
    uint32_t crc = archive::crc32_update(0, bytes, static_cast<std::size_t>(n));
    std::lock_guard<std::mutex> lock(mutex_);
    pieces_[c].push_back({offset, n, crc});
  }
  // The CRC-32 of all of c's record, when the pieces tile it exactly.
  std::optional<uint32_t> whole(const TensorChunk* c) {
    auto& pieces = pieces_[c];
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    uint64_t at = 0;
    uint32_t crc = 0;
    for (const Piece& p : pieces) {
      if (p.offset != at) return std::nullopt;
      crc = at == 0 ? p.crc : archive::crc32_combine(crc, p.crc, p.length);
      at += p.length;
    }
    if (at != c->storage->size()) return std::nullopt;
    return crc;
  }

 private:
  struct Piece {
    uint64_t offset, length;
    uint32_t crc;
  };
  std::unordered_set<const TensorChunk*> chunks_;
  std::mutex mutex_;
  std::map<const TensorChunk*, std::vector<Piece>> pieces_;
};

// Copies the parts of `chunks` inside rows [r0, r1) of dim 0 into `dst`,
// which holds those rows contiguous and row-major. A 0-dim tensor is one
// row of one element. Safe to call concurrently for disjoint row ranges.
// With `crcs`, the source bytes of the chunks it covers are summed too.
void gather_rows(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks, int64_t r0, int64_t r1,
                 std::byte* dst, PieceCrcs* crcs = nullptr) {
  std::size_t isz = dtype_size(t.dtype);
  std::vector<std::byte> scratch;
  if (t.shape.empty()) {
    if (chunks.empty()) fail(ErrorCode::kDataLoss, "a 0-dim tensor without bytes");
    const TensorChunk& c = *chunks.front();
    const std::byte* src = box_source(c, c.storage_offset, {}, isz, scratch);
    std::memcpy(dst, src, isz);
    if (crcs && crcs->covers(&c)) crcs->add(&c, 0, src, isz);
    if (c.big_endian) swap_elements(dst, 1, t.dtype);
    return;
  }
  Shape out_strides = contiguous_strides(t.shape);
  for (const TensorChunk* c : chunks) {
    int64_t lo = std::max(r0, c->offsets[0]), hi = std::min(r1, c->offsets[0] + c->sizes[0]);
    if (lo >= hi) continue;
    Shape extent = c->sizes;
    extent[0] = hi - lo;
    const std::byte* src =
        box_source(*c, c->storage_offset + (lo - c->offsets[0]) * c->strides[0], extent, isz, scratch);
    int64_t dst_elem = (lo - r0) * out_strides[0];
    for (std::size_t d = 1; d < t.shape.size(); ++d) dst_elem += c->offsets[d] * out_strides[d];
    copy_box(src, c->strides, dst + dst_elem * static_cast<int64_t>(isz), out_strides, extent, isz);
    if (crcs && crcs->covers(c)) {  // a whole record as rows: these rows are one range of it
      uint64_t row_bytes = shape_numel(Shape(c->sizes.begin() + 1, c->sizes.end())) * isz;
      crcs->add(c, static_cast<uint64_t>(lo - c->offsets[0]) * row_bytes, src,
                static_cast<uint64_t>(hi - lo) * row_bytes);
    }
    if (c->big_endian) swap_box(dst + dst_elem * static_cast<int64_t>(isz), out_strides, extent, t.dtype);
  }
}

// Rows [r0, r1) as they lie in a mapped source, when one chunk holds them
// all as contiguous rows in native byte order: a cast reads them there
// (SlabJob::view), and they are summed for PieceCrcs as gather_rows would.
// On the 2 GB bench checkpoint the gather's copy was 8% of a --dtype bf16
// run's CPU time.
const std::byte* view_rows(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks, int64_t r0, int64_t r1,
                           PieceCrcs* crcs) {
  if (t.shape.empty()) return nullptr;
  for (const TensorChunk* c : chunks) {
    if (r0 < c->offsets[0] || r1 > c->offsets[0] + c->sizes[0]) continue;
    const std::byte* base = c->storage->data();
    if (!base || c->big_endian || !is_contiguous_row_slab(t, *c)) return nullptr;
    std::size_t isz = dtype_size(t.dtype);
    uint64_t row_bytes = shape_numel(Shape(c->sizes.begin() + 1, c->sizes.end())) * isz;
    const std::byte* src =
        base + (c->storage_offset + (r0 - c->offsets[0]) * c->strides[0]) * static_cast<int64_t>(isz);
    if (crcs && crcs->covers(c))
      crcs->add(c, static_cast<uint64_t>(r0 - c->offsets[0]) * row_bytes, src,
                static_cast<uint64_t>(r1 - r0) * row_bytes);
    return src;
  }
  return nullptr;
}

// Releases the source bytes rows [r0, r1) of `chunks` were gathered from
// (whole pages only, see ByteSource::release): a tensor larger than the
// memory budget is read through its mapping slab by slab, and without this
// every page of it would stay in our RSS until the tensor ends.
void release_rows(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks, int64_t r0, int64_t r1) {
  if (t.shape.empty()) return;
  std::size_t isz = dtype_size(t.dtype);
  for (const TensorChunk* c : chunks) {
    int64_t lo = std::max(r0, c->offsets[0]), hi = std::min(r1, c->offsets[0] + c->sizes[0]);
    if (lo >= hi) continue;
    int64_t first = c->storage_offset + (lo - c->offsets[0]) * c->strides[0];
    int64_t span = 1 + (hi - lo - 1) * c->strides[0];
    for (std::size_t d = 1; d < c->sizes.size(); ++d) span += (c->sizes[d] - 1) * c->strides[d];
    c->storage->release(static_cast<uint64_t>(first) * isz, static_cast<uint64_t>(span) * isz);
  }
}

// The most bytes the slabs of one tensor hold at once, whatever
// --memory-limit allows: larger slabs do not read or write faster, and the
// process's peak RSS is these plus the pages being read.
constexpr uint64_t kMaxSlabBudget = 64ull << 20;

// Below this many output bytes a slab is appended on the calling thread: a
// thread per slab would cost more than the overlap saves.
constexpr std::size_t kMinOverlapBytes = 4u << 20;

// Assembles the tensor in dim-0 slabs through the backend (gather, cast to
// the output dtype, count NaN/Inf when asked) and appends each slab. While
// slab k is appended on a second thread (a write syscall, the zip CRC-32),
// slab k+1 is assembled: the backend keeps two result buffers for this
// (Backend::assemble), and the budget is shared by the two slabs.
FiniteCounts append_slabs_assembled(const TensorEntry& t, const std::vector<const TensorChunk*>& chunks,
                                    Destination& out, const CopyOptions& options, Backend& backend, bool scan,
                                    PieceCrcs* crcs) {
  int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  uint64_t row_elems = t.shape.empty() ? 1 : shape_numel(Shape(t.shape.begin() + 1, t.shape.end()));
  // Two slabs in flight, each with its cast copy.
  uint64_t per_row = 2 * row_elems * (dtype_size(t.dtype) + dtype_size(t.output_dtype()));
  uint64_t budget = std::min(options.memory_limit, kMaxSlabBudget);
  int64_t rows_per_slab = std::max<int64_t>(1, static_cast<int64_t>(budget / std::max<uint64_t>(per_row, 1)));
  FiniteCounts finite;
  std::future<void> writing;  // the previous slab's append; its destructor waits
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_slab) {
    SlabJob job;
    job.dtype = t.dtype;
    job.out_dtype = t.output_dtype();
    job.rows = std::min(rows, r0 + rows_per_slab) - r0;
    job.row_elems = row_elems;
    job.scan = scan;
    job.crc = out.wants_crc();
    job.gather = [&t, &chunks, r0, crcs](int64_t a, int64_t b, std::byte* dst) {
      gather_rows(t, chunks, r0 + a, r0 + b, dst, crcs);
    };
    job.view = [&t, &chunks, r0, crcs](int64_t a, int64_t b) { return view_rows(t, chunks, r0 + a, r0 + b, crcs); };
    SlabResult slab = backend.assemble(job);
    release_rows(t, chunks, r0, r0 + job.rows);
    finite += slab.finite;
    if (writing.valid()) writing.get();  // rethrows a failed append
    if (slab.bytes.size() < kMinOverlapBytes) {
      out.append(slab.bytes.data(), slab.bytes.size(), slab.crc);
    } else {
      writing = std::async(std::launch::async,
                           [&out, bytes = slab.bytes, crc = slab.crc] { out.append(bytes.data(), bytes.size(), crc); });
    }
  }
  if (writing.valid()) writing.get();
  return finite;
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
    // Big-endian elements are swapped on the way: never copied as they are.
    bool direct = std::all_of(chunks.begin(), chunks.end(),
                              [&](const TensorChunk* c) { return is_contiguous_row_slab(t, *c) && !c->big_endian; });
    bool swapped = std::any_of(chunks.begin(), chunks.end(), [](const TensorChunk* c) { return c->big_endian; });
    bool cast = t.out_dtype && *t.out_dtype != t.dtype;
    bool scan = static_cast<bool>(options.on_finite);
    bool assembled = t.numel() > 0 && !((direct || (t.shape.empty() && !swapped)) && !cast && !scan);
    // The CRC-32 of each source record a tensor reads. A record the gather
    // reads whole, row by row, is summed piece by piece as it is gathered
    // (PieceCrcs); one copied whole from a mapping or an object store, as
    // it is copied (copy_summing). The others are checked beside the copy,
    // on a thread of their own reading the same bytes from the page cache:
    // the copy moves bytes in the kernel (copy_file_range) or on the
    // backend's threads meanwhile. Either way a mismatch fails the tensor
    // before its append returns, so before any output is published. Small
    // records are checked in line: a thread would cost more than the
    // overlap saves.
    std::size_t isz = dtype_size(t.dtype);
    std::vector<const TensorChunk*> summed, apart, parts;
    bool zip = out.wants_crc();
    if (options.verify)
      for (const TensorChunk* c : chunks) {
        if (!c->storage_crc || !c->storage || options.verify->checked(c->storage.get())) continue;
        bool rows = t.shape.empty() || is_contiguous_row_slab(t, *c);
        bool once = std::count_if(chunks.begin(), chunks.end(),
                                  [&](const TensorChunk* o) { return o->storage == c->storage; }) == 1;
        if (assembled && rows && once && c->is_whole_contiguous_storage(isz))
          summed.push_back(c);
        else if (!assembled && zip && options.verify->deferring() && !c->is_whole_contiguous_storage(isz))
          parts.push_back(c);  // a part of its record, summed as it is copied (reshard)
        else if (!assembled && c->storage->data() && c->is_whole_contiguous_storage(isz))
          // A whole record in a mapped file is copied from the mapping,
          // summed on the way (copy_summing) instead of copied by the
          // kernel and read again by a check beside it: 2 GB DCP ws4
          // --no-fsync, the check cost 0.20 s of CPU over 0.61 s, now 0.02.
          parts.push_back(c);
        else if (!assembled && !c->storage->file_span(0) &&
                 (c->is_whole_contiguous_storage(isz) || options.verify->deferring()))
          // No kernel copy from this source (an object store's): the copy
          // reads it through a buffer anyway, so it sums the CRC-32 on the
          // way rather than a check reading every byte a second time (two
          // GETs per byte). A whole record is accepted at once; a part of
          // one, only where the caller checks what is left at the end
          // (deferring: reshard), waits for the rest or is read whole then.
          parts.push_back(c);
        else
          apart.push_back(c);
      }
    PieceCrcs crcs(summed);
    std::future<void> checking;
    if (!apart.empty()) {
      auto check = [&t, &apart, verifier = options.verify.get()] {
        for (const TensorChunk* c : apart) verifier->verify(*c, t.name);
      };
      if (options.verify->unchecked_bytes(apart) >= kMinOverlapBytes)
        checking = std::async(std::launch::async, check);
      else
        check();
    }
    if (t.numel() == 0) {
      if (options.on_finite) options.on_finite(t, FiniteCounts{});
      return;
    }
    if (!assembled) {
      append_slabs_direct(t, chunks, out, parts, options.verify.get());
    } else {
      // Without a backend (tests, callers that never cast) the CPU one
      // serves: it loads LibTorch only if a cast needs it.
      std::unique_ptr<Backend> fallback;
      Backend* backend = options.backend;
      if (!backend) backend = (fallback = make_cpu_backend(0)).get();
      FiniteCounts finite =
          append_slabs_assembled(t, chunks, out, options, *backend, scan, summed.empty() ? nullptr : &crcs);
      if (scan) options.on_finite(t, finite);
    }
    if (checking.valid()) checking.get();  // rethrows a mismatch
    for (const TensorChunk* c : summed) {
      if (auto crc = crcs.whole(c))
        options.verify->accept(*c, t.name, *crc);
      else
        options.verify->verify(*c, t.name);  // the pieces did not tile the record: sum it as a whole
    }
    // Bytes read through a mapping count in our RSS until released; one
    // tensor's sources at a time keeps peak memory independent of the
    // checkpoint's size.
    for (const TensorChunk* c : chunks) c->storage->release(0, c->storage->size());
  });
}

}  // namespace

uint64_t RecordVerifier::unchecked_bytes(const std::vector<const TensorChunk*>& chunks) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t n = 0;
  for (const TensorChunk* c : chunks)
    if (c->storage_crc && c->storage && !checked_.count(c->storage.get())) n += c->storage->size();
  return n;
}

bool RecordVerifier::checked(const ByteSource* record) {
  std::lock_guard<std::mutex> lock(mutex_);
  return checked_.count(record) > 0;
}

void RecordVerifier::verify(const TensorChunk& c, const std::string& tensor) {
  if (!c.storage_crc || !c.storage || checked(c.storage.get())) return;
  // One thread: this runs beside the tensor's copy (append_tensor_to).
  accept(c, tensor, archive::crc32_of(*c.storage, 1));
}

void RecordVerifier::accept(const TensorChunk& c, const std::string& tensor, uint32_t crc) {
  if (!c.storage_crc || !c.storage) return;
  if (crc != *c.storage_crc) {
    char got[16], want[16];
    std::snprintf(got, sizeof got, "%08x", crc);
    std::snprintf(want, sizeof want, "%08x", *c.storage_crc);
    fail(ErrorCode::kDataLoss, c.file + (c.rank >= 0 ? " (rank " + std::to_string(c.rank) + ")" : std::string()) +
                                   ": the record holding tensor '" + tensor + "' fails its CRC-32 (stored " + want +
                                   ", computed " + got +
                                   "): its bytes are corrupt; nothing was written (--no-verify skips this check for "
                                   "trusted input)");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  checked_.insert(c.storage.get());
}

void RecordVerifier::add_piece(const TensorChunk& c, const std::string& tensor, uint64_t offset, uint64_t n,
                               uint32_t crc) {
  std::optional<uint32_t> whole;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (checked_.count(c.storage.get())) return;
    Pending& p = pending_[c.storage.get()];
    if (p.tensor.empty()) {
      p.chunk = c;  // a copy: reshard's items are local views, gone before check_deferred
      p.tensor = tensor;
    }
    p.pieces.push_back({offset, n, crc});
    std::sort(p.pieces.begin(), p.pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    uint64_t at = 0;
    uint32_t sum = 0;
    bool tiled = true;
    for (const Piece& piece : p.pieces) {
      if (piece.offset != at) {
        tiled = false;
        break;
      }
      sum = at == 0 ? piece.crc : archive::crc32_combine(sum, piece.crc, piece.length);
      at += piece.length;
    }
    if (tiled && at == c.storage->size()) {
      whole = sum;
      pending_.erase(c.storage.get());
    }
  }
  if (whole) accept(c, tensor, *whole);
}

void RecordVerifier::check_deferred() {
  std::vector<Pending> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [record, p] : pending_) left.push_back(std::move(p));
    pending_.clear();
  }
  // Parts that overlap or leave gaps (a view that skips bytes of its
  // record): the record is read whole once.
  for (const Pending& p : left) verify(p.chunk, p.tensor);
}

void assemble_rows(const TensorEntry& t, int64_t r0, int64_t r1, std::byte* dst) {
  with_context("tensor '" + t.name + "'", [&] {
    auto chunks = nonempty_chunks(t);
    int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    if (t.shape.empty() && (r0 != 0 || r1 != 1)) fail(ErrorCode::kInternal, "a 0-dim tensor has exactly one row");
    if (r0 < 0 || r1 > rows || r0 > r1) fail(ErrorCode::kInternal, "rows outside the tensor");
    gather_rows(t, chunks, r0, r1, dst);
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
