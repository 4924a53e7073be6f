// Float conversions as bit arithmetic, exactly as torch's CPU kernels round
// them, compiled both for the host (core/float_cast.cc, the CPU backend's
// casts) and for the CUDA backend's device kernels.
//
// Non-NaN values follow IEEE round-to-nearest-even, which every torch path
// agrees on. NaN is where torch's own kernels differ from one another, and
// from CUDA's intrinsics: float->bfloat16 writes 0xFFFF in LibTorch's
// vectorised x86 kernels (AVX2, AVX-512), 0x7FC0 in its scalar ones and the
// canonical 0x7FFF on a device (PTX cvt.rn.bf16.f32); float->half keeps the
// payload on the CPU (F16C) but not on the device. So the NaN result of each
// pair is chosen where the pair is cast (float_cast.cc, per torch kernel),
// and the device never converts a NaN: the CUDA backend counts NaN inputs in
// every piece and casts a piece that has any on the host.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define CKPT_HD __host__ __device__ __forceinline__
#else
#define CKPT_HD inline
#endif

namespace ckpt {

CKPT_HD bool f32_is_nan(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }
CKPT_HD bool f16_is_nan(uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }
CKPT_HD bool bf16_is_nan(uint16_t b) { return (b & 0x7FFFu) > 0x7F80u; }

// float32 -> bfloat16, round to nearest even (c10::detail::round_to_nearest_even),
// for a u that is not NaN.
CKPT_HD uint16_t f32_to_bf16_number(uint32_t u) {
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The same with NaN as c10's scalar kernel writes it (the device's result for a
// NaN is never kept: NaN pieces are cast on the host).
CKPT_HD uint16_t f32_to_bf16(uint32_t u) { return f32_is_nan(u) ? uint16_t{0x7FC0u} : f32_to_bf16_number(u); }

// float32 -> float16, round to nearest even, overflow to Inf, subnormals
// exact; a NaN keeps the top of its payload and becomes quiet (F16C's vcvtps2ph).
CKPT_HD uint16_t f32_to_f16(uint32_t u) {
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a & 0x7FFFFFu) >> 13));
  // 65520 lies halfway between 65504 (largest half) and 65536: ties to even go up, to Inf.
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (a >= 0x38800000u) {  // a normal half (>= 2^-14)
    uint32_t r = (a >> 13) - (112u << 10);
    uint32_t rest = a & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;  // a carry into the exponent is right
    return static_cast<uint16_t>(sign | r);
  }
  // A half subnormal (units of 2^-24) or zero.
  uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t shift = 126u - e;  // 14..24
  uint32_t r = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

// bfloat16 -> float32: exact.
CKPT_HD uint32_t bf16_to_f32(uint16_t b) { return static_cast<uint32_t>(b) << 16; }

// float16 -> float32: exact; a NaN keeps its payload and becomes quiet, as
// F16C's vcvtph2ps (LibTorch's CPU kernel) makes it.
CKPT_HD uint32_t f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u);
  if (e == 0) {
    if (m == 0) return sign;
    // m * 2^-24, normalised: k shifts put the leading one at bit 10, giving
    // 1.f * 2^(-14-k), whose float32 biased exponent is 113 - k.
    uint32_t exp = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      --exp;
    }
    return sign | (exp << 23) | ((m & 0x3FFu) << 13);
  }
  return sign | ((e + 112u) << 23) | (m << 13);
}

}  // namespace ckpt
