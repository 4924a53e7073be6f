// The CPU backend: native gathers and finite scans split over threads, casts
// through LibTorch's CPU kernels (loaded only when a cast is asked for, so
// that validate --finite and plain consolidates never pay LibTorch's
// start-up).
#include <algorithm>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/parallel_ranges.h"
#include "exec/backend.h"
#include "exec/finite_scan.h"
#include "exec/torch_plugin.h"

namespace ckpt {
namespace {

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
    std::vector<FiniteCounts> counts(static_cast<std::size_t>(threads_));
    for_each_range(static_cast<int64_t>(n), useful_threads(n * isz, threads_), [&](int p, int64_t begin, int64_t end) {
      counts[static_cast<std::size_t>(p)] =
          count_nonfinite(data + static_cast<std::size_t>(begin) * isz, dtype, static_cast<std::size_t>(end - begin));
    });
    FiniteCounts total;
    for (const auto& c : counts) total += c;
    return total;
  }

  // Three passes over the slab (gather on our threads, cast on LibTorch's,
  // scan on ours): each is bound by memory bandwidth and parallel on its own,
  // and LibTorch's cast cannot be fused into a row-range worker without
  // changing its thread count process-wide.
  SlabResult assemble(const SlabJob& job) override {
    std::size_t in_row = job.row_elems * dtype_size(job.dtype);
    std::size_t n = static_cast<std::size_t>(job.rows) * job.row_elems;
    SlabBuffers& buf = buffers_[next_buffer_];
    next_buffer_ ^= 1;
    buf.gathered.resize(static_cast<std::size_t>(job.rows) * in_row);
    int parts = useful_threads(buf.gathered.size(), threads_);
    for_each_range(job.rows, parts, [&](int, int64_t r0, int64_t r1) {
      job.gather(r0, r1, buf.gathered.data() + static_cast<std::size_t>(r0) * in_row);
    });
    const std::vector<std::byte>* out = &buf.gathered;
    if (job.out_dtype != job.dtype) {
      buf.cast.resize(n * dtype_size(job.out_dtype));
      cast(buf.gathered.data(), job.dtype, buf.cast.data(), job.out_dtype, n);
      out = &buf.cast;
    }
    SlabResult result;
    if (job.scan) result.finite = scan_finite(out->data(), job.out_dtype, n);
    if (job.keep_output) result.bytes = std::span<const std::byte>(out->data(), out->size());
    return result;
  }

 private:
  int threads_;        // for native work
  int torch_threads_;  // passed to LibTorch (<= 0 keeps its default)
  // Slab buffers reused across slabs (a consolidate assembles thousands),
  // two sets used in turn (SlabResult says why).
  struct SlabBuffers {
    std::vector<std::byte> gathered, cast;
  };
  SlabBuffers buffers_[2];
  int next_buffer_ = 0;
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
