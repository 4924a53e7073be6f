// The native casts' scalar rules (core/cast_rules.h), which run for the
// tail of every range and for all of it on a CPU without F16C, against the
// F16C instructions that run for the rest, which are what LibTorch's CPU
// kernels use for half (tests/test_native_cast.py checks both against
// torch through the CLI, where the tails are a few elements).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/float_cast.h"

namespace ckpt {
namespace {

template <typename In, typename Out>
void check_tail_equals_bulk(const std::vector<In>& in, DType from, DType to) {
  std::vector<Out> bulk(in.size()), one(in.size());
  REQUIRE(native_cast(reinterpret_cast<const std::byte*>(in.data()), from, reinterpret_cast<std::byte*>(bulk.data()),
                      to, in.size()));
  // n = 1: every element takes the scalar tail.
  for (std::size_t i = 0; i < in.size(); ++i)
    native_cast(reinterpret_cast<const std::byte*>(&in[i]), from, reinterpret_cast<std::byte*>(&one[i]), to, 1);
  for (std::size_t i = 0; i < in.size(); ++i) {
    INFO("input 0x" << std::hex << static_cast<uint64_t>(in[i]) << ": bulk 0x" << static_cast<uint64_t>(bulk[i])
                    << ", scalar 0x" << static_cast<uint64_t>(one[i]));
    REQUIRE(bulk[i] == one[i]);
  }
}

}  // namespace

TEST_CASE("Native float16 casts: the scalar rules equal the vector instructions on every float16 pattern",
          "[float_cast]") {
  std::vector<uint16_t> every(65536);
  for (uint32_t i = 0; i < every.size(); ++i) every[i] = static_cast<uint16_t>(i);
  check_tail_equals_bulk<uint16_t, uint32_t>(every, DType::kFloat16, DType::kFloat32);
}

TEST_CASE("Native float32 to float16: the scalar rule equals the vector instruction on a spread of patterns",
          "[float_cast]") {
  std::vector<uint32_t> in;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t m : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x3000u, 0x2000u, 0x7FFFFFu, 0x400000u, 0x400001u})
        in.push_back(sign | (e << 23) | m);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < (1 << 20); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    in.push_back(static_cast<uint32_t>(x));
  }
  check_tail_equals_bulk<uint32_t, uint16_t>(in, DType::kFloat32, DType::kFloat16);
}

TEST_CASE("Native casts cover the --dtype pairs and refuse the others", "[float_cast]") {
  for (DType from : {DType::kFloat64, DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (DType to : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
      CHECK(has_native_cast(from, to) == (from != to));
  CHECK_FALSE(has_native_cast(DType::kFloat8E4M3FN, DType::kBFloat16));
  CHECK_FALSE(has_native_cast(DType::kFloat32, DType::kFloat64));
  std::byte in[8] = {}, out[8] = {};
  CHECK_FALSE(native_cast(in, DType::kFloat8E5M2, out, DType::kFloat32, 1));
}

}  // namespace ckpt
