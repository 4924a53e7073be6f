#include "diff/tensor_diff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/progress.h"
#include "exec/tensor_copy.h"

namespace ckpt {
namespace {

// Elements decoded at a time: small fixed buffers, whatever the slab size.
constexpr std::size_t kBlock = 4096;
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
  std::vector<double> av(std::min(n, kBlock) * ap), bv(std::min(n, kBlock) * bp);
  for (std::size_t i = 0; i < n; i += kBlock) {
    std::size_t m = std::min(kBlock, n - i);
    decode_to_double(a + i * asz, da, m, av.data());
    decode_to_double(b + i * bsz, db, m, bv.data());
    compare_doubles(av.data(), ap, bv.data(), bp, m, base + i, tol, s);
  }
}

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
  std::size_t workers = threads > 0 ? static_cast<std::size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
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
  int64_t rows = a.shape.empty() ? 1 : a.shape[0];
  uint64_t row_elems = a.shape.empty() ? 1 : a.numel() / static_cast<uint64_t>(rows);
  uint64_t row_a = row_elems * dtype_size(a.dtype), row_b = row_elems * dtype_size(b.dtype);
  int64_t rows_per_slab = std::max<int64_t>(1, static_cast<int64_t>(options.memory_limit / (row_a + row_b)));
  std::vector<std::byte> slab_a, slab_b;
  for (int64_t r0 = 0; r0 < rows; r0 += rows_per_slab) {
    int64_t r1 = std::min(rows, r0 + rows_per_slab);
    auto n = static_cast<std::size_t>(static_cast<uint64_t>(r1 - r0) * row_elems);
    slab_a.resize(n * dtype_size(a.dtype));
    slab_b.resize(n * dtype_size(b.dtype));
    with_context("A", [&] { assemble_rows(a, r0, r1, slab_a.data()); });
    with_context("B", [&] { assemble_rows(b, r0, r1, slab_b.data()); });
    uint64_t base = static_cast<uint64_t>(r0) * row_elems;
    if (a.dtype == b.dtype && std::memcmp(slab_a.data(), slab_b.data(), slab_a.size()) == 0) {
      // Identical bits: every element equal (or NaN on both sides), diff 0.
      stats.elements += n;
    } else {
      compare_elements(slab_a.data(), a.dtype, slab_b.data(), b.dtype, n, base, tol, stats, options.threads);
    }
    progress_add(slab_a.size() + slab_b.size());
  }
  for (const TensorEntry* t : {&a, &b})
    for (const auto& c : t->chunks) c.storage->release(0, c.storage->size());
  return stats;
}

}  // namespace ckpt
