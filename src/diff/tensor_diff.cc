#include "diff/tensor_diff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/progress.h"
#include "exec/tensor_copy.h"
#include "model/repeated_dims.h"

namespace ckpt {
namespace {

// Elements decoded at a time: small fixed buffers, whatever the slab size.
constexpr std::size_t kBlock = 4096;
// Bytes of both sides' rows per slab: large enough to amortise the per-slab
// work, small enough to stay in cache (--memory-limit lowers it further).
constexpr uint64_t kSlabTarget = 16ull << 20;
// Below this many elements a slab is compared on the calling thread.
constexpr std::size_t kMinElementsPerThread = 1 << 16;

// One element pair, already decoded. `diff` and `b_mag` are |a - b| and |b|.
struct Pair {
  bool equal, both_nan, finite;
  double diff, b_mag;
};

void record(const Pair& p, const ElementSample& sample, const Tolerance& tol, ValueStats& s) {
  ++s.elements;
  bool close = p.equal || p.both_nan || (std::isfinite(p.diff) && p.diff <= tol.atol + tol.rtol * p.b_mag);
  if (p.finite) {
    if (p.diff > s.max_abs_diff) {
      s.max_abs_diff = p.diff;
      s.max_abs_at = sample;
    }
    if (p.b_mag != 0) s.max_rel_diff = std::max(s.max_rel_diff, p.diff / p.b_mag);
  }
  if (close) return;
  ++s.mismatched;
  if (!p.finite) ++s.nonfinite_mismatched;
  if (!s.first_mismatch) s.first_mismatch = sample;
}

// Real values, or (real, imaginary) pairs when `parts` is 2 on a side.
void compare_doubles(const double* a, int a_parts, const double* b, int b_parts, std::size_t n, uint64_t base,
                     const Tolerance& tol, ValueStats& s) {
  for (std::size_t i = 0; i < n; ++i) {
    double ar = a[i * a_parts], ai = a_parts == 2 ? a[i * 2 + 1] : 0.0;
    double br = b[i * b_parts], bi = b_parts == 2 ? b[i * 2 + 1] : 0.0;
    bool real = a_parts == 1 && b_parts == 1;
    Pair p;
    p.equal = ar == br && ai == bi;
    p.both_nan = (std::isnan(ar) || std::isnan(ai)) && (std::isnan(br) || std::isnan(bi));
    p.finite = std::isfinite(ar) && std::isfinite(ai) && std::isfinite(br) && std::isfinite(bi);
    p.diff = real ? std::fabs(ar - br) : std::hypot(ar - br, ai - bi);
    p.b_mag = real ? std::fabs(br) : std::hypot(br, bi);
    if (p.equal) p.diff = 0;
    record(p, {base + i, ar, ai, br, bi}, tol, s);
  }
}

void compare_integers(const WideInt* a, const WideInt* b, std::size_t n, uint64_t base, const Tolerance& tol,
                      ValueStats& s) {
  for (std::size_t i = 0; i < n; ++i) {
    WideInt d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
    Pair p{a[i] == b[i], false, true, static_cast<double>(d), static_cast<double>(b[i] < 0 ? -b[i] : b[i])};
    record(p, {base + i, static_cast<double>(a[i]), 0, static_cast<double>(b[i]), 0}, tol, s);
  }
}

// The single-threaded comparison of one contiguous range, decoded block by block.
void compare_range(const std::byte* a, DType da, const std::byte* b, DType db, std::size_t n, uint64_t base,
                   const Tolerance& tol, ValueStats& s) {
  std::size_t asz = dtype_size(da), bsz = dtype_size(db);
  if (is_integer_dtype(da) && is_integer_dtype(db)) {
    std::vector<WideInt> av(std::min(n, kBlock)), bv(av.size());
    for (std::size_t i = 0; i < n; i += kBlock) {
      std::size_t m = std::min(kBlock, n - i);
      decode_integers(a + i * asz, da, m, av.data());
      decode_integers(b + i * bsz, db, m, bv.data());
      compare_integers(av.data(), bv.data(), m, base + i, tol, s);
    }
    return;
  }
  int ap = value_parts(da), bp = value_parts(db);
  // float4 packs two values an element: compared, indexed and counted as values.
  const int packed = packed_values(da);
  if (packed_values(db) != packed)
    fail(ErrorCode::kInternal, "compare_elements: float4_e2m1fn_x2 against " +
                                   std::string(dtype_name(packed == 2 ? db : da)) + " (values not comparable)");
  std::vector<double> av(std::min(n, kBlock) * ap * packed), bv(std::min(n, kBlock) * bp * packed);
  for (std::size_t i = 0; i < n; i += kBlock) {
    std::size_t m = std::min(kBlock, n - i);
    decode_to_double(a + i * asz, da, m, av.data());
    decode_to_double(b + i * bsz, db, m, bv.data());
    compare_doubles(av.data(), ap, bv.data(), bp, m * packed, (base + i) * packed, tol, s);
  }
}

// Rows of one tensor for comparison: a pointer into its mapped source when
// one chunk holds the rows contiguously (whole tensors, row shards), else
// assembled into a buffer by the executor's gather (exec/tensor_copy.h).
class SlabReader {
 public:
  explicit SlabReader(const TensorEntry& t) : t_(t) {
    for (const auto& c : t.chunks) {
      if (c.numel() == 0 || t.shape.empty()) continue;
      boundaries_.push_back(c.offsets[0]);
      boundaries_.push_back(c.offsets[0] + c.sizes[0]);
    }
    std::sort(boundaries_.begin(), boundaries_.end());
  }

  // The first chunk edge after r0 (or no limit).
  int64_t next_boundary(int64_t r0) const {
    auto it = std::upper_bound(boundaries_.begin(), boundaries_.end(), r0);
    return it == boundaries_.end() ? std::numeric_limits<int64_t>::max() : *it;
  }

  const std::byte* rows(int64_t r0, int64_t r1) {
    std::size_t isz = dtype_size(t_.dtype);
    for (const auto& c : t_.chunks)
      if (const std::byte* p = in_place(c, r0, r1, isz)) return p;
    uint64_t row_elems = t_.shape.empty() ? 1 : t_.numel() / static_cast<uint64_t>(t_.shape[0]);
    buffer_.resize(static_cast<std::size_t>(static_cast<uint64_t>(r1 - r0) * row_elems * isz));
    assemble_rows(t_, r0, r1, buffer_.data());
    return buffer_.data();
  }

  // Drops the mapped pages of the chunks holding rows [r0, r1): memory stays
  // at about one slab whatever the tensor's size (pages a later slab needs
  // again come back from the page cache).
  void release(int64_t r0, int64_t r1) const {
    for (const auto& c : t_.chunks) {
      if (c.numel() == 0) continue;
      bool overlaps = t_.shape.empty() || (c.offsets[0] < r1 && r0 < c.offsets[0] + c.sizes[0]);
      if (overlaps) c.storage->release(0, c.storage->size());
    }
  }

 private:
  // Rows [r0, r1) of chunk c when they are contiguous bytes of a mapped source.
  const std::byte* in_place(const TensorChunk& c, int64_t r0, int64_t r1, std::size_t isz) const {
    const std::byte* base = c.storage->data();
    if (!base || c.numel() == 0 || c.big_endian) return nullptr;  // big-endian: assembled, which swaps
    if (t_.shape.empty()) return base + c.storage_offset * static_cast<int64_t>(isz);
    if (c.offsets[0] > r0 || r1 > c.offsets[0] + c.sizes[0]) return nullptr;
    int64_t expect = 1;
    for (std::size_t d = t_.shape.size(); d-- > 1;) {
      if (c.offsets[d] != 0 || c.sizes[d] != t_.shape[d]) return nullptr;
      if (c.sizes[d] != 1 && c.strides[d] != expect) return nullptr;
      expect *= c.sizes[d];
    }
    if (r1 - r0 > 1 && c.strides[0] != expect) return nullptr;
    int64_t first = c.storage_offset + (r0 - c.offsets[0]) * c.strides[0];
    uint64_t bytes = static_cast<uint64_t>(r1 - r0) * static_cast<uint64_t>(expect) * isz;
    if (first < 0 || static_cast<uint64_t>(first) * isz + bytes > c.storage->size()) return nullptr;
    return base + first * static_cast<int64_t>(isz);
  }

  const TensorEntry& t_;
  std::vector<int64_t> boundaries_;
  std::vector<std::byte> buffer_;
};

}  // namespace

void ValueStats::merge(const ValueStats& later) {
  elements += later.elements;
  mismatched += later.mismatched;
  nonfinite_mismatched += later.nonfinite_mismatched;
  if (later.max_abs_diff > max_abs_diff) {
    max_abs_diff = later.max_abs_diff;
    max_abs_at = later.max_abs_at;
  }
  max_rel_diff = std::max(max_rel_diff, later.max_rel_diff);
  if (!first_mismatch) first_mismatch = later.first_mismatch;
}

void compare_elements(const std::byte* a, DType da, const std::byte* b, DType db, std::size_t n, uint64_t index_base,
                      const Tolerance& tol, ValueStats& stats, int threads) {
  std::size_t workers =
      threads > 0 ? static_cast<std::size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  workers = std::max<std::size_t>(1, std::min(workers, n / kMinElementsPerThread));
  if (workers == 1) {
    compare_range(a, da, b, db, n, index_base, tol, stats);
    return;
  }
  // Contiguous parts in order, merged in order: the same result as one thread.
  std::vector<ValueStats> parts(workers);
  std::vector<std::thread> pool;
  std::size_t per = (n + workers - 1) / workers;
  for (std::size_t w = 0; w < workers; ++w) {
    std::size_t lo = std::min(n, w * per), hi = std::min(n, lo + per);
    pool.emplace_back([&, w, lo, hi] {
      compare_range(a + lo * dtype_size(da), da, b + lo * dtype_size(db), db, hi - lo, index_base + lo, tol, parts[w]);
    });
  }
  for (auto& t : pool) t.join();
  for (const auto& p : parts) stats.merge(p);
}

ValueStats compare_tensor_values(const TensorEntry& a, const TensorEntry& b, const Tolerance& tol,
                                 const StreamOptions& options) {
  if (a.shape != b.shape) fail(ErrorCode::kInternal, "compare_tensor_values: shapes differ");
  ValueStats stats;
  if (a.numel() == 0) return stats;
  // A dimension both sides view with stride 0 repeats the same comparison:
  // made once, its counts scaled and its samples' indices placed at the
  // first element they stand for (model/repeated_dims.h).
  std::vector<std::size_t> dims, in_b = repeated_dims(b);
  for (std::size_t d : repeated_dims(a))
    if (std::binary_search(in_b.begin(), in_b.end(), d)) dims.push_back(d);
  if (!dims.empty()) {
    stats = compare_tensor_values(without_dims(a, dims), without_dims(b, dims), tol, options);
    const uint64_t repeats = repeat_count(a.shape, dims);
    stats.elements *= repeats;
    stats.mismatched *= repeats;
    stats.nonfinite_mismatched *= repeats;
    for (std::optional<ElementSample>* s : {&stats.first_mismatch, &stats.max_abs_at})
      if (*s) {  // a float4 sample's index counts values, two an element
        const uint64_t packed = packed_values(a.dtype);
        (*s)->index = full_index(a.shape, dims, (*s)->index / packed) * packed + (*s)->index % packed;
      }
    return stats;
  }
  int64_t rows = a.shape.empty() ? 1 : a.shape[0];
  uint64_t row_elems = a.shape.empty() ? 1 : a.numel() / static_cast<uint64_t>(rows);
  uint64_t row_bytes = row_elems * (dtype_size(a.dtype) + dtype_size(b.dtype));
  // Slabs much larger than the caches only cost page faults; the budget caps them.
  uint64_t slab_bytes = std::min(options.memory_limit, kSlabTarget);
  int64_t rows_per_slab = std::max<int64_t>(1, static_cast<int64_t>(slab_bytes / row_bytes));
  SlabReader side_a(a), side_b(b);
  for (int64_t r0 = 0; r0 < rows;) {
    // Slabs end where a chunk ends, so that row shards are read in place.
    int64_t r1 = std::min({rows, r0 + rows_per_slab, side_a.next_boundary(r0), side_b.next_boundary(r0)});
    auto n = static_cast<std::size_t>(static_cast<uint64_t>(r1 - r0) * row_elems);
    const std::byte* pa = with_context("A", [&] { return side_a.rows(r0, r1); });
    const std::byte* pb = with_context("B", [&] { return side_b.rows(r0, r1); });
    std::size_t na = n * dtype_size(a.dtype), nb = n * dtype_size(b.dtype);
    if (a.dtype == b.dtype && std::memcmp(pa, pb, na) == 0) {
      // Identical bits: every element equal (or NaN on both sides), diff 0.
      stats.elements += n * static_cast<uint64_t>(packed_values(a.dtype));
    } else {
      compare_elements(pa, a.dtype, pb, b.dtype, n, static_cast<uint64_t>(r0) * row_elems, tol, stats, options.threads);
    }
    side_a.release(r0, r1);
    side_b.release(r0, r1);
    progress_add(na + nb);
    r0 = r1;
  }
  return stats;
}

}  // namespace ckpt
