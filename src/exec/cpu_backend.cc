// The CPU backend: native finite scans split over threads, casts through
// LibTorch's CPU kernels (loaded only when a cast is asked for, so that
// validate --finite never pays LibTorch's start-up).
#include <algorithm>
#include <thread>
#include <vector>

#include "core/error.h"
#include "exec/backend.h"
#include "exec/finite_scan.h"
#include "exec/torch_plugin.h"

namespace ckpt {
namespace {

// Below this many bytes per thread, starting threads costs more than it saves.
constexpr std::size_t kMinBytesPerThread = 4u << 20;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
        torch_threads_(threads) {}

  std::string name() const override { return "cpu"; }

  void cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) override {
    const CkptTorchApi& api = require_torch_plugin("dtype casts");
    if (const char* err = api.cast(src, static_cast<int>(from), dst, static_cast<int>(to), n, torch_threads_))
      fail(ErrorCode::kInternal, std::string("cast ") + std::string(dtype_name(from)) + " -> " +
                                     std::string(dtype_name(to)) + " failed: " + err);
  }

  FiniteCounts scan_finite(const std::byte* data, DType dtype, std::size_t n) override {
    std::size_t isz = dtype_size(dtype);
    std::size_t parts = std::min<std::size_t>(static_cast<std::size_t>(threads_), n * isz / kMinBytesPerThread);
    if (parts <= 1) return count_nonfinite(data, dtype, n);
    std::vector<FiniteCounts> counts(parts);
    std::vector<std::thread> workers;
    std::size_t per = (n + parts - 1) / parts;
    for (std::size_t p = 0; p < parts; ++p) {
      std::size_t begin = std::min(n, p * per), end = std::min(n, begin + per);
      workers.emplace_back([&, p, begin, end] { counts[p] = count_nonfinite(data + begin * isz, dtype, end - begin); });
    }
    FiniteCounts total;
    for (std::size_t p = 0; p < parts; ++p) {
      workers[p].join();
      total += counts[p];
    }
    return total;
  }

 private:
  int threads_;        // for native work
  int torch_threads_;  // passed to LibTorch (<= 0 keeps its default)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

Device parse_device(const std::string& text) {
  if (text == "auto") return Device::kAuto;
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  fail_invalid("--device must be auto, cpu or cuda (got '" + text + "')");
}

}  // namespace ckpt
