// Float casts done natively, bit for bit as torch's `Tensor.to(dtype)` on
// the CPU does them, so that `--dtype` needs no LibTorch for the pairs it
// is used with: from float64, float32, bfloat16 or float16 to float32,
// bfloat16 or float16. Other pairs (float8 sources) go through LibTorch.
// tests/test_native_cast.py checks every pair against torch over every
// 16-bit pattern and a large float32/float64 sample, NaN payloads included.
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace ckpt {

// True when native_cast converts from -> to (from != to).
bool has_native_cast(DType from, DType to);

// Converts n elements of `from` at src to `to` at dst, on the calling
// thread (callers split large ranges over threads). Pointers need no
// alignment. False, converting nothing, when !has_native_cast(from, to).
// Depends on nothing but dtype.h's enum, so that the CUDA plugin, which
// does not link ckpt_core, compiles it in for its host-side casts.
bool native_cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n);

}  // namespace ckpt
