// NaN/Inf counting on raw element bits, for every floating dtype torch has.
// Bit tests rather than std::isnan so that half, bfloat16 and the float8
// formats need no conversion, and so that -ffast-math could never fold them.
#pragma once

#include <cstddef>

#include "exec/backend.h"

namespace ckpt {

// Single-threaded reference used by the CPU backend (which splits the range
// over threads) and by the CUDA backend's equality tests.
FiniteCounts count_nonfinite(const std::byte* data, DType dtype, std::size_t n);

}  // namespace ckpt
