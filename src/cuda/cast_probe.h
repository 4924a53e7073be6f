// Start-up check that a device conversion kernel equals this host's LibTorch
// CPU cast for every non-NaN input class (see cast_rules.h for why NaN is
// excluded): all 65536 patterns of a 16-bit source, and for float32 sources
// the rounding boundaries of the target plus a million pseudo-random
// patterns. LibTorch's CPU kernels differ by CPU (AVX2, AVX-512, AVX-512
// BF16), so equality is checked where it runs instead of assumed.
#pragma once

#include <string>

namespace ckpt::cuda {

// Empty when the kernel for from -> to (ckpt::DType codes) matches the host
// cast bit for bit; otherwise why not (the first differing input).
std::string probe_cast_rule(int from_dtype, int to_dtype, int host_threads);

}  // namespace ckpt::cuda
