#include "core/float_cast.h"

#include <bit>
#include <cstdint>
#include <cstring>

#include "core/cast_rules.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ckpt {
namespace {

// Element loops in fixed blocks: a constant trip count lets the compiler
// vectorise the rule at -O2 (its cheap cost model refuses loops that would
// need a scalar epilogue); the tail runs one element at a time.
template <typename In, typename Out, typename Rule>
bool convert(const std::byte* src, std::byte* dst, std::size_t n, Rule rule) {
  constexpr std::size_t kBlock = 16;
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    In in[kBlock];
    Out out[kBlock];
    std::memcpy(in, src + i * sizeof(In), sizeof in);
    for (std::size_t k = 0; k < kBlock; ++k) out[k] = rule(in[k]);
    std::memcpy(dst + i * sizeof(Out), out, sizeof out);
  }
  for (; i < n; ++i) {
    In in;
    std::memcpy(&in, src + i * sizeof(In), sizeof in);
    Out out = rule(in);
    std::memcpy(dst + i * sizeof(Out), &out, sizeof out);
  }
  return true;
}

// float64 -> float32 as the hardware converts (round to nearest even; a NaN
// keeps the top of its payload and becomes quiet), which is what torch does.
uint32_t f64_to_f32(uint64_t u) { return std::bit_cast<uint32_t>(static_cast<float>(std::bit_cast<double>(u))); }
bool f64_is_nan(uint64_t u) { return (u & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull; }

// The NaN torch writes (cast_rules.h says why kernels differ). LibTorch's
// CPU casts run vectorised over blocks of a tensor and scalar over each
// block's tail, and for NaN the two disagree (float64 -> bfloat16: 0xFFFF
// against 0x7FC0; float16 -> float32: a quiet NaN with the payload against
// 0x7FFFFFFF); where the tails fall depends on the tensor's length and
// torch's thread count. We write what the vectorised kernels write, for
// every element: float32 (and float64 through float32) -> bfloat16 gives
// 0xFFFF; the half conversions are F16C's. float16 -> bfloat16 has no
// vectorised kernel: c10's scalar one writes 0x7FC0. Found by
// tests/test_native_cast.py, which checks each pair against torch.
constexpr uint16_t kVectorBf16Nan = 0xFFFFu;
constexpr uint16_t kScalarBf16Nan = 0x7FC0u;

#if defined(__x86_64__)
// F16C converts 8 elements per instruction and is exactly what LibTorch's
// CPU kernels use for half (round to nearest even, NaN payloads kept).
bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("avx2");  // every AVX2 CPU has F16C
  return yes;
}

__attribute__((target("avx,f16c"))) std::size_t f32_to_f16_f16c(const std::byte* src, std::byte* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(src + i * 4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * 2), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}

__attribute__((target("avx,f16c"))) std::size_t f16_to_f32_f16c(const std::byte* src, std::byte* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * 2));
    _mm256_storeu_ps(reinterpret_cast<float*>(dst + i * 4), _mm256_cvtph_ps(v));
  }
  return i;
}
#endif

bool cast_f32_to_f16(const std::byte* src, std::byte* dst, std::size_t n) {
  std::size_t done = 0;
#if defined(__x86_64__)
  if (has_f16c()) done = f32_to_f16_f16c(src, dst, n);
#endif
  return convert<uint32_t, uint16_t>(src + done * 4, dst + done * 2, n - done, f32_to_f16);
}

bool cast_f16_to_f32(const std::byte* src, std::byte* dst, std::size_t n) {
  std::size_t done = 0;
#if defined(__x86_64__)
  if (has_f16c()) done = f16_to_f32_f16c(src, dst, n);
#endif
  return convert<uint16_t, uint32_t>(src + done * 2, dst + done * 4, n - done, f16_to_f32);
}

bool is_native_source(DType d) {
  return d == DType::kFloat64 || d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}
bool is_native_target(DType d) { return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16; }

}  // namespace

bool has_native_cast(DType from, DType to) { return from != to && is_native_source(from) && is_native_target(to); }

bool native_cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) {
  using D = DType;
  if (from == D::kFloat32 && to == D::kBFloat16)
    return convert<uint32_t, uint16_t>(
        src, dst, n, [](uint32_t u) { return f32_is_nan(u) ? kVectorBf16Nan : f32_to_bf16_number(u); });
  if (from == D::kFloat32 && to == D::kFloat16) return cast_f32_to_f16(src, dst, n);
  if (from == D::kBFloat16 && to == D::kFloat32) return convert<uint16_t, uint32_t>(src, dst, n, bf16_to_f32);
  if (from == D::kFloat16 && to == D::kFloat32) return cast_f16_to_f32(src, dst, n);
  if (from == D::kBFloat16 && to == D::kFloat16)
    return convert<uint16_t, uint16_t>(src, dst, n, [](uint16_t b) { return f32_to_f16(bf16_to_f32(b)); });
  if (from == D::kFloat16 && to == D::kBFloat16)
    return convert<uint16_t, uint16_t>(
        src, dst, n, [](uint16_t h) { return f16_is_nan(h) ? kScalarBf16Nan : f32_to_bf16_number(f16_to_f32(h)); });
  if (from == D::kFloat64 && to == D::kFloat32) return convert<uint64_t, uint32_t>(src, dst, n, f64_to_f32);
  // float64 -> 16 bits: torch converts to float32 first, then rounds again.
  if (from == D::kFloat64 && to == D::kBFloat16)
    return convert<uint64_t, uint16_t>(
        src, dst, n, [](uint64_t u) { return f64_is_nan(u) ? kVectorBf16Nan : f32_to_bf16_number(f64_to_f32(u)); });
  if (from == D::kFloat64 && to == D::kFloat16)
    return convert<uint64_t, uint16_t>(src, dst, n, [](uint64_t u) { return f32_to_f16(f64_to_f32(u)); });
  return false;
}

}  // namespace ckpt
