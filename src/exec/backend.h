// The arithmetic the executor needs on tensor bytes, behind one interface so
// that a CUDA implementation can replace the CPU one with identical results
// (DESIGN.md "Backends"). Buffers are host memory in every call: a device
// backend stages them itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace ckpt {

// Non-finite elements found by a scan. A complex element counts once: as
// NaN when either part is NaN, else as Inf when either part is infinite.
struct FiniteCounts {
  uint64_t nan = 0;
  uint64_t inf = 0;  // +Inf and -Inf

  bool all_finite() const { return nan == 0 && inf == 0; }
  FiniteCounts& operator+=(const FiniteCounts& o) {
    nan += o.nan;
    inf += o.inf;
    return *this;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", or "cuda:<index>".
  virtual std::string name() const = 0;
  // Converts n elements, rounding exactly as torch's Tensor.to(dtype) does.
  virtual void cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) = 0;
  // Counts NaN and Inf among n elements. Integer and bool dtypes have none.
  virtual FiniteCounts scan_finite(const std::byte* data, DType dtype, std::size_t n) = 0;
};

enum class Device { kAuto, kCpu, kCuda };

// The native CPU backend: scans run on `threads` threads (<= 0: all
// hardware threads); casts run on LibTorch's CPU kernels through the plugin,
// loaded on the first cast only (Unimplemented then if it cannot be loaded).
std::unique_ptr<Backend> make_cpu_backend(int threads);

// The backend for --device: kCpu, kCuda (InvalidArgument when this build or
// machine has no CUDA device), or kAuto (CUDA when available, else CPU).
std::unique_ptr<Backend> make_backend(Device device, int threads);

// "auto", "cpu", "cuda"; InvalidArgument otherwise.
Device parse_device(const std::string& text);

}  // namespace ckpt
