#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "exec/backend.h"
#include "exec/finite_scan.h"

using namespace ckpt;

namespace {

template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

TEST_CASE("finite scan counts NaN and Inf in float32 and float64", "[finite]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto f32 = bytes_of(std::vector<float>{1.f, nan, -inf, inf, 0.f, -nan, 3.4e38f});
  FiniteCounts c = count_nonfinite(f32.data(), DType::kFloat32, 7);
  CHECK(c.nan == 2);
  CHECK(c.inf == 2);
  auto f64 = bytes_of(std::vector<double>{1e308, std::nan(""), -1e-320});
  c = count_nonfinite(f64.data(), DType::kFloat64, 3);
  CHECK(c.nan == 1);
  CHECK(c.inf == 0);
}

TEST_CASE("finite scan reads half, bfloat16 and float8 bit patterns", "[finite]") {
  // float16: 0x7C00 +Inf, 0xFC00 -Inf, 0x7E00 NaN, 0x7BFF max finite
  auto f16 = bytes_of(std::vector<uint16_t>{0x7C00, 0xFC00, 0x7E00, 0x7BFF, 0x0001});
  FiniteCounts c = count_nonfinite(f16.data(), DType::kFloat16, 5);
  CHECK(c.inf == 2);
  CHECK(c.nan == 1);
  // bfloat16: 0x7F80 +Inf, 0x7FC0 NaN, 0x7F7F max finite
  auto bf16 = bytes_of(std::vector<uint16_t>{0x7F80, 0x7FC0, 0x7F7F, 0xFFC1});
  c = count_nonfinite(bf16.data(), DType::kBFloat16, 4);
  CHECK(c.inf == 1);
  CHECK(c.nan == 2);
  auto f8 = bytes_of(std::vector<uint8_t>{0x7F, 0xFF, 0x7E, 0x80, 0x7C, 0xFC, 0x7D});
  c = count_nonfinite(f8.data(), DType::kFloat8E4M3FN, 7);  // NaN: S.1111.111 only, no Inf
  CHECK(c.nan == 2);
  CHECK(c.inf == 0);
  c = count_nonfinite(f8.data(), DType::kFloat8E5M2, 7);  // 0x7C/0xFC Inf; 0x7D,0x7E,0x7F,0xFF NaN
  CHECK(c.inf == 2);
  CHECK(c.nan == 4);
  c = count_nonfinite(f8.data(), DType::kFloat8E4M3FNUZ, 7);  // NaN: 0x80 only
  CHECK(c.nan == 1);
  c = count_nonfinite(f8.data(), DType::kFloat8E8M0FNU, 7);  // NaN: 0xFF only
  CHECK(c.nan == 1);
  // float4 e2m1 has no NaN or Inf: 0xFF is -6, -6
  CHECK(count_nonfinite(f8.data(), DType::kFloat4E2M1FNx2, 7).all_finite());
}

TEST_CASE("finite scan counts a complex element once", "[finite]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto c64 = bytes_of(std::vector<float>{nan, inf, 1.f, inf, 2.f, 3.f});
  FiniteCounts c = count_nonfinite(c64.data(), DType::kComplex64, 3);
  CHECK(c.nan == 1);
  CHECK(c.inf == 1);
}

TEST_CASE("finite scan ignores integer and bool dtypes", "[finite]") {
  std::vector<std::byte> ones(16, std::byte{0xFF});
  CHECK(count_nonfinite(ones.data(), DType::kInt32, 4).all_finite());
  CHECK(count_nonfinite(ones.data(), DType::kUInt8, 16).all_finite());
}

TEST_CASE("CPU backend's threaded scan equals the single-threaded reference", "[finite]") {
  std::size_t n = 6u << 20;  // 24 MiB of float32: several threads' worth
  std::vector<float> v(n, 1.5f);
  for (std::size_t i = 7; i < n; i += 100003) v[i] = std::numeric_limits<float>::quiet_NaN();
  v[n - 1] = -std::numeric_limits<float>::infinity();
  auto bytes = bytes_of(v);
  FiniteCounts ref = count_nonfinite(bytes.data(), DType::kFloat32, n);
  auto backend = make_cpu_backend(4);
  FiniteCounts got = backend->scan_finite(bytes.data(), DType::kFloat32, n);
  CHECK(got.nan == ref.nan);
  CHECK(got.inf == 1);
  CHECK(ref.nan == (n - 7 + 100002) / 100003);
}

TEST_CASE("device names for --device parse; others are usage errors", "[finite]") {
  CHECK(parse_device("auto") == Device::kAuto);
  CHECK(parse_device("cpu") == Device::kCpu);
  CHECK(parse_device("cuda") == Device::kCuda);
  CHECK_THROWS(parse_device("gpu"));
}
