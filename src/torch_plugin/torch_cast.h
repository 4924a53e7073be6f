// The one LibTorch CPU cast of the plugins: the CPU backend's casts, and the
// CUDA backend's host-side casts (pieces holding NaN, dtype pairs without a
// device kernel), so that both round and write NaN exactly alike.
#pragma once

#include <cstddef>

namespace ckpt {

// Converts n elements (ckpt::DType codes) as torch's Tensor.to does, on
// `threads` LibTorch threads (<= 0 keeps its default). Returns NULL, or an
// error message valid until the next call on this thread.
const char* torch_cast(const void* src, int from_dtype, void* dst, int to_dtype, std::size_t n, int threads);

// Bytes per element of a ckpt::DType code; 0 for an unknown code.
std::size_t torch_element_size(int dtype);

}  // namespace ckpt
