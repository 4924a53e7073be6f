// Decoding checks against the bit layouts in c10/util/Float8_*.h, Half.h and
// BFloat16.h; tests/test_diff.py checks every bit pattern against torch.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "diff/element_values.h"

using namespace ckpt;

TEST_CASE("float8 e4m3fn: bias 7, no Inf, S.1111.111 is NaN", "[diff]") {
  CHECK(float8_to_double(0x38, DType::kFloat8E4M3FN) == 1.0);
  CHECK(float8_to_double(0xB8, DType::kFloat8E4M3FN) == -1.0);
  CHECK(float8_to_double(0x7E, DType::kFloat8E4M3FN) == 448.0);                // largest
  CHECK(float8_to_double(0x01, DType::kFloat8E4M3FN) == std::ldexp(1.0, -9));  // smallest subnormal
  CHECK(float8_to_double(0x78, DType::kFloat8E4M3FN) == 256.0);                // exponent 1111 is a number
  CHECK(std::isnan(float8_to_double(0x7F, DType::kFloat8E4M3FN)));
  CHECK(std::isnan(float8_to_double(0xFF, DType::kFloat8E4M3FN)));
}

TEST_CASE("float8 e4m3fnuz and e5m2fnuz: bias 8 and 16, 0x80 is NaN", "[diff]") {
  CHECK(float8_to_double(0x40, DType::kFloat8E4M3FNUZ) == 1.0);
  CHECK(float8_to_double(0x7F, DType::kFloat8E4M3FNUZ) == 240.0);
  CHECK(float8_to_double(0x01, DType::kFloat8E4M3FNUZ) == std::ldexp(1.0, -10));
  CHECK(std::isnan(float8_to_double(0x80, DType::kFloat8E4M3FNUZ)));
  CHECK(float8_to_double(0x40, DType::kFloat8E5M2FNUZ) == 1.0);
  CHECK(float8_to_double(0x7F, DType::kFloat8E5M2FNUZ) == 57344.0);
  CHECK(float8_to_double(0x01, DType::kFloat8E5M2FNUZ) == std::ldexp(1.0, -17));
  CHECK(std::isnan(float8_to_double(0x80, DType::kFloat8E5M2FNUZ)));
}

TEST_CASE("float8 e5m2 is IEEE-like with Inf and NaN; e8m0fnu is a power of two", "[diff]") {
  CHECK(float8_to_double(0x3C, DType::kFloat8E5M2) == 1.0);
  CHECK(float8_to_double(0x7B, DType::kFloat8E5M2) == 57344.0);
  CHECK(float8_to_double(0x01, DType::kFloat8E5M2) == std::ldexp(1.0, -16));
  CHECK(float8_to_double(0x7C, DType::kFloat8E5M2) == INFINITY);
  CHECK(float8_to_double(0xFC, DType::kFloat8E5M2) == -INFINITY);
  CHECK(std::isnan(float8_to_double(0x7D, DType::kFloat8E5M2)));
  CHECK(float8_to_double(0x7F, DType::kFloat8E8M0FNU) == 1.0);
  CHECK(float8_to_double(0x00, DType::kFloat8E8M0FNU) == std::ldexp(1.0, -127));
  CHECK(float8_to_double(0xFE, DType::kFloat8E8M0FNU) == std::ldexp(1.0, 127));
  CHECK(std::isnan(float8_to_double(0xFF, DType::kFloat8E8M0FNU)));
}

TEST_CASE("float4 e2m1: every nibble a number, two a byte, the first in the low nibble", "[diff]") {
  const double want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (uint8_t n = 0; n < 16; ++n) {
    CHECK(float4_e2m1_to_double(n) == want[n]);
    CHECK(std::signbit(float4_e2m1_to_double(n)) == (n >= 8));
  }
  CHECK(packed_values(DType::kFloat4E2M1FNx2) == 2);
  CHECK(packed_values(DType::kFloat8E4M3FN) == 1);
  // torch.testing._internal.common_quantized.pack_uint4: byte = second << 4 | first.
  const std::byte bytes[2] = {std::byte{0x72}, std::byte{0x0F}};
  double out[4];
  decode_to_double(bytes, DType::kFloat4E2M1FNx2, 2, out);
  CHECK(out[0] == 1.0);   // 0x2
  CHECK(out[1] == 6.0);   // 0x7
  CHECK(out[2] == -6.0);  // 0xF
  CHECK(out[3] == 0.0);   // 0x0
}

TEST_CASE("float16 and bfloat16 decode exactly", "[diff]") {
  CHECK(float16_to_double(0x3C00) == 1.0);
  CHECK(float16_to_double(0x7BFF) == 65504.0);
  CHECK(float16_to_double(0x0001) == std::ldexp(1.0, -24));
  CHECK(float16_to_double(0x7C00) == INFINITY);
  CHECK(float16_to_double(0xFC00) == -INFINITY);
  CHECK(std::isnan(float16_to_double(0x7E00)));
  CHECK(std::signbit(float16_to_double(0x8000)));
  CHECK(bfloat16_to_double(0x3F80) == 1.0);
  CHECK(bfloat16_to_double(0x4049) == 3.140625);
  CHECK(bfloat16_to_double(0x7F80) == INFINITY);
  CHECK(std::isnan(bfloat16_to_double(0x7FC0)));
}

TEST_CASE("decode_to_double reads unaligned elements; complex as (real, imaginary)", "[diff]") {
  std::vector<std::byte> buf(1 + 2 * sizeof(float));
  float v[2] = {1.5f, -2.25f};
  std::memcpy(buf.data() + 1, v, sizeof v);
  double out[2];
  decode_to_double(buf.data() + 1, DType::kComplex64, 1, out);
  CHECK(out[0] == 1.5);
  CHECK(out[1] == -2.25);
  uint16_t half[2] = {0x3C00, 0xC000};  // complex32 (1 - 2j)
  decode_to_double(reinterpret_cast<const std::byte*>(half), DType::kComplex32, 1, out);
  CHECK(out[0] == 1.0);
  CHECK(out[1] == -2.0);
}

TEST_CASE("integers decode exactly beyond 2^53; bool is any non-zero byte", "[diff]") {
  uint64_t big[2] = {(1ull << 60) + 1, ~0ull};
  WideInt out[2];
  decode_integers(reinterpret_cast<const std::byte*>(big), DType::kUInt64, 2, out);
  CHECK(out[0] == (static_cast<WideInt>(1) << 60) + 1);
  CHECK(out[1] == static_cast<WideInt>(~0ull));
  int8_t neg = -128;
  decode_integers(reinterpret_cast<const std::byte*>(&neg), DType::kInt8, 1, out);
  CHECK(out[0] == -128);
  std::byte bools[2] = {std::byte{0}, std::byte{2}};
  double d[2];
  decode_to_double(bools, DType::kBool, 2, d);
  CHECK(d[0] == 0.0);
  CHECK(d[1] == 1.0);
  CHECK(is_integer_dtype(DType::kBool));
  CHECK_FALSE(is_integer_dtype(DType::kBFloat16));
}
