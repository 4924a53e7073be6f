// Element-by-element comparison of two tensors of one shape, with
// torch.isclose semantics, streamed in row slabs under a memory budget.
//
// Element a (from A) is close to b (from B) when
//   a == b, or both are NaN, or |a - b| <= atol + rtol * |b|   (|a - b| finite)
// which is torch.isclose(a, b, rtol, atol, equal_nan=True): NaN matches NaN,
// +Inf matches +Inf only, and the tolerance is relative to B. Complex
// elements use the modulus of the difference and of b, and are NaN when
// either part is. Integer and bool elements compare exactly (as 128-bit
// integers), so int64 values beyond 2^53 are not rounded together.
#pragma once

#include <cstdint>
#include <optional>

#include "diff/element_values.h"
#include "model/checkpoint_model.h"

namespace ckpt {

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

// One element: its flat (row-major) index and both values (imaginary parts
// 0 for real dtypes).
struct ElementSample {
  uint64_t index = 0;
  double a_re = 0, a_im = 0, b_re = 0, b_im = 0;
};

struct ValueStats {
  uint64_t elements = 0;              // elements compared
  uint64_t mismatched = 0;            // elements not close
  uint64_t nonfinite_mismatched = 0;  // of those: NaN or Inf on either side
  // Over elements whose values are finite on both sides: max |a - b|, and
  // max |a - b| / |b| where b != 0.
  double max_abs_diff = 0;
  double max_rel_diff = 0;
  std::optional<ElementSample> first_mismatch;
  std::optional<ElementSample> max_abs_at;  // first element reaching max_abs_diff, when > 0

  // Folds in the stats of elements that all come after this one's.
  void merge(const ValueStats& later);
};

// Compares n elements of dtype `da` at `a` with n of dtype `db` at `b`
// (contiguous; dtypes may differ), the first having flat index `index_base`.
// Splits the work over `threads` threads when n is large (<= 0: hardware
// threads); the result does not depend on the split.
void compare_elements(const std::byte* a, DType da, const std::byte* b, DType db, std::size_t n, uint64_t index_base,
                      const Tolerance& tol, ValueStats& stats, int threads = 1);

struct StreamOptions {
  uint64_t memory_limit = 256ull << 20;  // both tensors' row slabs together
  int threads = 0;
};

// Reads A and B (same shape; validated models) in row slabs that together
// fit the budget (at least one row each; at most 16 MiB) and compares every
// element. Rows that lie contiguously in a mapped source are compared in
// place; others are assembled by the executor's gather. Reports bytes read
// to the progress scope, and releases the sources' mapped pages after each
// slab.
ValueStats compare_tensor_values(const TensorEntry& a, const TensorEntry& b, const Tolerance& tol,
                                 const StreamOptions& options);

}  // namespace ckpt
