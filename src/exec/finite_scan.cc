#include "exec/finite_scan.h"

#include <cstring>

namespace ckpt {
namespace {

// IEEE-style layout: all exponent bits set means Inf (mantissa 0) or NaN.
template <typename Bits>
struct Ieee {
  Bits exp_mask, mant_mask;
  // 0 finite, 1 Inf, 2 NaN
  int classify(Bits b) const {
    if ((b & exp_mask) != exp_mask) return 0;
    return (b & mant_mask) ? 2 : 1;
  }
};

constexpr Ieee<uint64_t> kF64{0x7FF0000000000000ull, 0x000FFFFFFFFFFFFFull};
constexpr Ieee<uint32_t> kF32{0x7F800000u, 0x007FFFFFu};
constexpr Ieee<uint16_t> kF16{0x7C00u, 0x03FFu};
constexpr Ieee<uint16_t> kBF16{0x7F80u, 0x007Fu};

template <typename Bits>
Bits load(const std::byte* p) {
  Bits b;
  std::memcpy(&b, p, sizeof b);
  return b;
}

// How many of `count` values have every exponent bit set (Inf or NaN): a
// branch-free loop the compiler vectorizes, so the common all-finite case
// runs at memory speed and the exact classification below runs only on
// tensors that hold a non-finite value.
template <typename Bits>
std::size_t count_special(const std::byte* data, std::size_t count, Bits exp_mask) {
  std::size_t special = 0;
  for (std::size_t i = 0; i < count; ++i) special += (load<Bits>(data + i * sizeof(Bits)) & exp_mask) == exp_mask;
  return special;
}

// `parts` values of the layout make one element (2 for complex).
template <typename Bits>
FiniteCounts scan_ieee(const std::byte* data, std::size_t n, const Ieee<Bits>& f, int parts) {
  FiniteCounts c;
  if (count_special<Bits>(data, n * static_cast<std::size_t>(parts), f.exp_mask) == 0) return c;
  for (std::size_t i = 0; i < n; ++i) {
    int worst = 0;
    for (int k = 0; k < parts; ++k) {
      int v = f.classify(load<Bits>(data + (i * parts + k) * sizeof(Bits)));
      worst = v > worst ? v : worst;
    }
    c.nan += worst == 2;
    c.inf += worst == 1;
  }
  return c;
}

// Float8 formats without Inf: NaN is one or two exact bit patterns.
FiniteCounts scan_nan_patterns(const std::byte* data, std::size_t n, uint8_t mask, uint8_t pattern) {
  FiniteCounts c;
  for (std::size_t i = 0; i < n; ++i) c.nan += (static_cast<uint8_t>(data[i]) & mask) == pattern;
  return c;
}

FiniteCounts scan_e5m2(const std::byte* data, std::size_t n) {
  FiniteCounts c;
  for (std::size_t i = 0; i < n; ++i) {
    auto b = static_cast<uint8_t>(data[i]);
    if ((b & 0x7C) != 0x7C) continue;
    if (b & 0x03)
      ++c.nan;
    else
      ++c.inf;
  }
  return c;
}

}  // namespace

FiniteCounts count_nonfinite(const std::byte* data, DType dtype, std::size_t n) {
  switch (dtype) {
    case DType::kFloat64: return scan_ieee(data, n, kF64, 1);
    case DType::kFloat32: return scan_ieee(data, n, kF32, 1);
    case DType::kFloat16: return scan_ieee(data, n, kF16, 1);
    case DType::kBFloat16: return scan_ieee(data, n, kBF16, 1);
    case DType::kComplex32: return scan_ieee(data, n, kF16, 2);
    case DType::kComplex64: return scan_ieee(data, n, kF32, 2);
    case DType::kComplex128: return scan_ieee(data, n, kF64, 2);
    case DType::kFloat8E4M3FN: return scan_nan_patterns(data, n, 0x7F, 0x7F);  // S.1111.111
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2FNUZ: return scan_nan_patterns(data, n, 0xFF, 0x80);  // negative zero pattern
    case DType::kFloat8E8M0FNU: return scan_nan_patterns(data, n, 0xFF, 0xFF);
    case DType::kFloat8E5M2: return scan_e5m2(data, n);
    case DType::kFloat4E2M1FNx2: return {};  // e2m1 has no NaN or Inf pattern: every nibble is a number
    default: return {};
  }
}

}  // namespace ckpt
