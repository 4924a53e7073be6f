#include "diff/element_values.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"

namespace ckpt {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A finite sign.exponent.mantissa value: exponent 0 is subnormal
// (mantissa * 2^(1 - bias - mantissa_bits)), otherwise the implicit leading
// one applies. Special patterns (Inf, NaN) are the caller's business.
double minifloat(uint32_t bits, int exp_bits, int mant_bits, int bias) {
  uint32_t mant = bits & ((1u << mant_bits) - 1);
  uint32_t exp = (bits >> mant_bits) & ((1u << exp_bits) - 1);
  bool negative = (bits >> (mant_bits + exp_bits)) & 1u;
  double v = exp == 0
                 ? std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits)
                 : std::ldexp(static_cast<double>(mant | (1u << mant_bits)), static_cast<int>(exp) - bias - mant_bits);
  return negative ? -v : v;
}

// Every value of a one-byte format, computed once.
using Table256 = std::array<double, 256>;

template <class Fn>
Table256 make_table(Fn decode) {
  Table256 t{};
  for (uint32_t b = 0; b < 256; ++b) t[b] = decode(b);
  return t;
}

const Table256& float8_table(DType dtype) {
  static const Table256 e4m3fn =
      make_table([](uint32_t b) { return (b & 0x7F) == 0x7F ? kNaN : minifloat(b, 4, 3, 7); });
  static const Table256 e4m3fnuz = make_table([](uint32_t b) { return b == 0x80 ? kNaN : minifloat(b, 4, 3, 8); });
  static const Table256 e5m2 = make_table([](uint32_t b) {
    if ((b & 0x7C) != 0x7C) return minifloat(b, 5, 2, 15);
    if (b & 0x03) return kNaN;
    return (b & 0x80) ? -kInf : kInf;
  });
  static const Table256 e5m2fnuz = make_table([](uint32_t b) { return b == 0x80 ? kNaN : minifloat(b, 5, 2, 16); });
  static const Table256 e8m0fnu =
      make_table([](uint32_t b) { return b == 0xFF ? kNaN : std::ldexp(1.0, static_cast<int>(b) - 127); });
  switch (dtype) {
    case DType::kFloat8E4M3FN: return e4m3fn;
    case DType::kFloat8E4M3FNUZ: return e4m3fnuz;
    case DType::kFloat8E5M2: return e5m2;
    case DType::kFloat8E5M2FNUZ: return e5m2fnuz;
    case DType::kFloat8E8M0FNU: return e8m0fnu;
    default: fail(ErrorCode::kInternal, "not a float8 dtype: " + std::string(dtype_name(dtype)));
  }
}

// The 16 e2m1 values (every nibble is a number).
const std::array<double, 16>& e2m1_table() {
  static const std::array<double, 16> t = [] {
    std::array<double, 16> v{};
    for (uint32_t b = 0; b < 16; ++b) v[b] = minifloat(b, 2, 1, 1);
    return v;
  }();
  return t;
}

double half_bits_to_double(uint16_t bits) {
  if ((bits & 0x7C00) != 0x7C00) return minifloat(bits, 5, 10, 15);
  if (bits & 0x03FF) return kNaN;
  return (bits & 0x8000) ? -kInf : kInf;
}

// float16 through a table of all 65536 values (as float: each is exact).
const std::vector<float>& float16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t b = 0; b < 65536; ++b) t[b] = static_cast<float>(half_bits_to_double(static_cast<uint16_t>(b)));
    return t;
  }();
  return table;
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <class T>
void decode_plain(const std::byte* src, std::size_t count, double* out) {
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<double>(load<T>(src + i * sizeof(T)));
}

template <class T>
void decode_ints(const std::byte* src, std::size_t n, WideInt* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<WideInt>(load<T>(src + i * sizeof(T)));
}

void decode_half(const std::byte* src, std::size_t count, double* out) {
  const float* table = float16_table().data();
  for (std::size_t i = 0; i < count; ++i) out[i] = table[load<uint16_t>(src + 2 * i)];
}

}  // namespace

bool is_integer_dtype(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
    case DType::kBool: return true;
    default: return false;
  }
}

double float8_to_double(uint8_t bits, DType dtype) { return float8_table(dtype)[bits]; }
double float4_e2m1_to_double(uint8_t nibble) { return e2m1_table()[nibble & 0x0F]; }
double float16_to_double(uint16_t bits) { return half_bits_to_double(bits); }

double bfloat16_to_double(uint16_t bits) {
  // bfloat16 is the upper half of a float32.
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof f);
  return f;
}

void decode_to_double(const std::byte* src, DType dtype, std::size_t n, double* out) {
  switch (dtype) {
    case DType::kFloat64: return decode_plain<double>(src, n, out);
    case DType::kFloat32: return decode_plain<float>(src, n, out);
    case DType::kComplex128: return decode_plain<double>(src, 2 * n, out);
    case DType::kComplex64: return decode_plain<float>(src, 2 * n, out);
    case DType::kFloat16: return decode_half(src, n, out);
    case DType::kComplex32: return decode_half(src, 2 * n, out);
    case DType::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16_to_double(load<uint16_t>(src + 2 * i));
      return;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0FNU: {
      const Table256& table = float8_table(dtype);
      for (std::size_t i = 0; i < n; ++i) out[i] = table[static_cast<uint8_t>(src[i])];
      return;
    }
    case DType::kFloat4E2M1FNx2: {
      const std::array<double, 16>& table = e2m1_table();
      for (std::size_t i = 0; i < n; ++i) {
        auto b = static_cast<uint8_t>(src[i]);
        out[2 * i] = table[b & 0x0F];
        out[2 * i + 1] = table[b >> 4];
      }
      return;
    }
    case DType::kInt8: return decode_plain<int8_t>(src, n, out);
    case DType::kInt16: return decode_plain<int16_t>(src, n, out);
    case DType::kInt32: return decode_plain<int32_t>(src, n, out);
    case DType::kInt64: return decode_plain<int64_t>(src, n, out);
    case DType::kUInt8: return decode_plain<uint8_t>(src, n, out);
    case DType::kUInt16: return decode_plain<uint16_t>(src, n, out);
    case DType::kUInt32: return decode_plain<uint32_t>(src, n, out);
    case DType::kUInt64: return decode_plain<uint64_t>(src, n, out);
    case DType::kBool:
      // torch reads any non-zero byte of a bool tensor as True.
      for (std::size_t i = 0; i < n; ++i) out[i] = src[i] != std::byte{0} ? 1.0 : 0.0;
      return;
  }
  fail(ErrorCode::kInternal, "decode_to_double: unknown dtype");
}

void decode_integers(const std::byte* src, DType dtype, std::size_t n, WideInt* out) {
  switch (dtype) {
    case DType::kInt8: return decode_ints<int8_t>(src, n, out);
    case DType::kInt16: return decode_ints<int16_t>(src, n, out);
    case DType::kInt32: return decode_ints<int32_t>(src, n, out);
    case DType::kInt64: return decode_ints<int64_t>(src, n, out);
    case DType::kUInt8: return decode_ints<uint8_t>(src, n, out);
    case DType::kUInt16: return decode_ints<uint16_t>(src, n, out);
    case DType::kUInt32: return decode_ints<uint32_t>(src, n, out);
    case DType::kUInt64: return decode_ints<uint64_t>(src, n, out);
    case DType::kBool:
      for (std::size_t i = 0; i < n; ++i) out[i] = src[i] != std::byte{0};
      return;
    default: fail(ErrorCode::kInternal, "decode_integers: not an integer dtype: " + std::string(dtype_name(dtype)));
  }
}

}  // namespace ckpt
