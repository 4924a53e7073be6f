#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "diff/tensor_diff.h"

using namespace ckpt;

namespace {

template <class T>
const std::byte* bytes(const std::vector<T>& v) {
  return reinterpret_cast<const std::byte*>(v.data());
}

template <class T>
std::string as_string(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

ValueStats compare(const std::vector<float>& a, const std::vector<float>& b, Tolerance tol, int threads = 1) {
  ValueStats s;
  compare_elements(bytes(a), DType::kFloat32, bytes(b), DType::kFloat32, a.size(), 0, tol, s, threads);
  return s;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("closeness is |a - b| <= atol + rtol * |b|, relative to B", "[diff]") {
  std::vector<float> a = {1.0f, 2.0f, 10.0f, -4.0f}, b = {1.0f, 2.5f, 9.0f, -4.0f};
  ValueStats exact = compare(a, b, {});
  CHECK(exact.elements == 4);
  CHECK(exact.mismatched == 2);
  CHECK(exact.max_abs_diff == 1.0);
  CHECK(exact.max_rel_diff == Approx(0.5 / 2.5));
  REQUIRE(exact.first_mismatch);
  CHECK(exact.first_mismatch->index == 1);
  CHECK(exact.first_mismatch->a_re == 2.0);
  CHECK(exact.first_mismatch->b_re == 2.5);
  REQUIRE(exact.max_abs_at);
  CHECK(exact.max_abs_at->index == 2);
  // rtol 0.15: 1 <= 0.15 * 9 holds, 0.5 <= 0.15 * 2.5 does not; rtol 0.2: 0.5 <= 0.2 * 2.5.
  CHECK(compare(a, b, {0.1, 0}).mismatched == 2);
  CHECK(compare(a, b, {0.15, 0}).mismatched == 1);
  CHECK(compare(a, b, {0.2, 0}).mismatched == 0);
  CHECK(compare(a, b, {0, 1.0}).mismatched == 0);
  CHECK(compare(a, b, {0, 0.999}).mismatched == 1);
}

TEST_CASE("NaN matches NaN, Inf only the same Inf; non-finite pairs stay out of the max diffs", "[diff]") {
  std::vector<float> a = {kNaN, kInf, kInf, kNaN, 1.0f, 0.0f}, b = {kNaN, kInf, -kInf, 1.0f, 1.5f, -0.0f};
  ValueStats s = compare(a, b, {0, 1e30});
  CHECK(s.elements == 6);
  CHECK(s.mismatched == 2);  // Inf vs -Inf, NaN vs 1
  CHECK(s.nonfinite_mismatched == 2);
  CHECK(s.max_abs_diff == 0.5);
  REQUIRE(s.first_mismatch);
  CHECK(s.first_mismatch->index == 2);
}

TEST_CASE("max rel diff skips b == 0; a != 0 against 0 still counts by atol", "[diff]") {
  ValueStats s = compare({1e-3f, 2.0f}, {0.0f, 2.0f}, {});
  CHECK(s.mismatched == 1);
  CHECK(s.max_abs_diff == Approx(1e-3));
  CHECK(s.max_rel_diff == 0.0);
}

TEST_CASE("int64 compares exactly beyond 2^53", "[diff]") {
  std::vector<int64_t> a = {(int64_t{1} << 60) + 1, -5}, b = {int64_t{1} << 60, -5};
  ValueStats s;
  compare_elements(bytes(a), DType::kInt64, bytes(b), DType::kInt64, 2, 0, {}, s);
  CHECK(s.mismatched == 1);
  CHECK(s.max_abs_diff == 1.0);
  ValueStats tolerant;
  compare_elements(bytes(a), DType::kInt64, bytes(b), DType::kInt64, 2, 0, {0, 1.0}, tolerant);
  CHECK(tolerant.mismatched == 0);
}

TEST_CASE("complex differences use the modulus; a real tensor is a complex one with zero imaginary part", "[diff]") {
  std::vector<float> a = {3.0f, 4.0f}, b = {0.0f, 0.0f};  // (3+4j) vs 0j
  ValueStats s;
  compare_elements(bytes(a), DType::kComplex64, bytes(b), DType::kComplex64, 1, 0, {}, s);
  CHECK(s.max_abs_diff == 5.0);
  std::vector<double> real = {3.0};
  ValueStats mixed;
  compare_elements(bytes(real), DType::kFloat64, bytes(a), DType::kComplex64, 1, 0, {}, mixed);
  CHECK(mixed.max_abs_diff == 4.0);
  CHECK(mixed.max_rel_diff == Approx(4.0 / 5.0));
}

TEST_CASE("float32 against its bfloat16 rounding differs by the rounding error", "[diff]") {
  std::vector<float> a = {1.0f, 3.14159274f};
  std::vector<uint16_t> b = {0x3F80, 0x4049};  // bfloat16 1.0, 3.140625
  ValueStats s;
  compare_elements(bytes(a), DType::kFloat32, bytes(b), DType::kBFloat16, 2, 0, {}, s);
  CHECK(s.mismatched == 1);
  CHECK(s.max_abs_diff == Approx(3.14159274 - 3.140625));
}

TEST_CASE("the result does not depend on the number of threads", "[diff]") {
  std::vector<float> a(300000), b(300000);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = b[i] = static_cast<float>(i % 977) * 0.5f;
  b[7] += 0.25f;
  b[150001] += 2.0f;
  b[299999] = kNaN;
  b[250000] += 2.0f;  // ties with 150001: the first one is reported
  ValueStats one = compare(a, b, {}, 1), four = compare(a, b, {}, 4);
  for (const ValueStats* s : {&one, &four}) {
    CHECK(s->elements == 300000);
    CHECK(s->mismatched == 4);
    CHECK(s->nonfinite_mismatched == 1);
    CHECK(s->max_abs_diff == 2.0);
    REQUIRE(s->max_abs_at);
    CHECK(s->max_abs_at->index == 150001);
    REQUIRE(s->first_mismatch);
    CHECK(s->first_mismatch->index == 7);
  }
}

TEST_CASE("tensors stream in row slabs from their chunks, whatever the slab size", "[diff]") {
  // A: 3x2 split by rows; B: the same values split by columns, one changed.
  TensorEntry a, b;
  a.name = b.name = "w";
  a.shape = b.shape = {3, 2};
  std::vector<float> top = {1, 2, 3, 4}, bottom = {5, 6}, left = {1, 3, 5}, right = {2, 4, 6.5f};
  a.chunks = {{{0, 0}, {2, 2}, make_memory_source(as_string(top)), 0, {2, 1}, std::nullopt, "a0", 0, ""},
              {{2, 0}, {1, 2}, make_memory_source(as_string(bottom)), 0, {2, 1}, std::nullopt, "a1", 1, ""}};
  b.chunks = {{{0, 0}, {3, 1}, make_memory_source(as_string(left)), 0, {1, 1}, std::nullopt, "b0", 0, ""},
              {{0, 1}, {3, 1}, make_memory_source(as_string(right)), 0, {1, 1}, std::nullopt, "b1", 1, ""}};
  for (uint64_t limit : {uint64_t{1}, uint64_t{16}, uint64_t{1} << 20}) {
    ValueStats s = compare_tensor_values(a, b, {}, {limit, 1});
    CHECK(s.elements == 6);
    CHECK(s.mismatched == 1);
    CHECK(s.max_abs_diff == 0.5);
    REQUIRE(s.first_mismatch);
    CHECK(s.first_mismatch->index == 5);
  }
}

TEST_CASE("a 0-dim tensor is one element", "[diff]") {
  TensorEntry a, b;
  a.name = b.name = "step";
  std::vector<float> x = {3.0f}, y = {4.0f};
  a.chunks = {{{}, {}, make_memory_source(as_string(x)), 0, {}, std::nullopt, "a", 0, ""}};
  b.chunks = {{{}, {}, make_memory_source(as_string(y)), 0, {}, std::nullopt, "b", 0, ""}};
  ValueStats s = compare_tensor_values(a, b, {}, {});
  CHECK(s.elements == 1);
  CHECK(s.max_abs_diff == 1.0);
}
