// The arithmetic the executor needs on tensor bytes, behind one interface so
// that a CUDA implementation can replace the CPU one with identical results.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace ckpt {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Converts n elements, rounding exactly as torch's Tensor.to(dtype) does.
  virtual void cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) = 0;
};

// LibTorch's CPU kernels, through the plugin loaded on first use;
// threads <= 0 keeps LibTorch's default. Unimplemented when the plugin
// cannot be loaded.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace ckpt
