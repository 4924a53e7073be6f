// The CPU backend: gathers, casts and finite scans split over threads, all
// native except the casts float_cast.h does not cover (from float8), which
// go through LibTorch's CPU kernels, loaded only when such a cast is asked
// for: --dtype bf16, validate --finite and plain consolidates never pay
// LibTorch's start-up or its resident memory.
#include <algorithm>
#include <thread>
#include <vector>

#include "archive/zip_writer.h"
#include "core/error.h"
#include "core/float_cast.h"
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
    if (has_native_cast(from, to)) {  // else LibTorch
      std::size_t in = dtype_size(from), out = dtype_size(to);
      for_each_range(static_cast<int64_t>(n), useful_threads(n * in, threads_), [&](int, int64_t begin, int64_t end) {
        native_cast(src + static_cast<std::size_t>(begin) * in, from, dst + static_cast<std::size_t>(begin) * out, to,
                    static_cast<std::size_t>(end - begin));
      });
      return;
    }
    cast_with_torch(src, from, dst, to, n);
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

  // One pass over the slab: each thread takes a range of rows and, a block
  // of rows at a time, gathers it, casts it and counts its NaN/Inf while the
  // block is still in cache. With a cast, the gathered block is a small
  // per-thread scratch, so the slab's memory is its output alone; rows that
  // lie contiguous in a mapped source (SlabJob::view) are cast from there,
  // without the gather's copy. A cast
  // only LibTorch does runs in three passes instead (gather, LibTorch's own
  // threads, scan): its kernel cannot be fused into our workers.
  SlabResult assemble(const SlabJob& job) override {
    std::size_t in_row = job.row_elems * dtype_size(job.dtype);
    std::size_t out_row = job.row_elems * dtype_size(job.out_dtype);
    std::size_t n = static_cast<std::size_t>(job.rows) * job.row_elems;
    SlabBuffers& buf = buffers_[next_buffer_];
    next_buffer_ ^= 1;
    bool cast = job.out_dtype != job.dtype;
    bool fused = !cast || has_native_cast(job.dtype, job.out_dtype);
    std::vector<std::byte>& out = cast ? buf.cast : buf.gathered;
    out.resize(static_cast<std::size_t>(job.rows) * out_row);
    int parts = useful_threads(static_cast<uint64_t>(job.rows) * in_row, threads_);
    std::vector<FiniteCounts> counts(static_cast<std::size_t>(parts));
    // Per part, the CRC-32 of its output rows, summed block by block while
    // the block is in cache, then joined in order (crc32_combine).
    std::vector<uint32_t> crcs(static_cast<std::size_t>(parts), 0);
    std::vector<uint64_t> lengths(static_cast<std::size_t>(parts), 0);
    if (fused) {
      int64_t block = std::max<int64_t>(1, static_cast<int64_t>(kBlockBytes / std::max<std::size_t>(in_row, 1)));
      for_each_range(job.rows, parts, [&](int p, int64_t r0, int64_t r1) {
        std::vector<std::byte> scratch;
        for (int64_t a = r0; a < r1; a += block) {
          int64_t b = std::min(r1, a + block);
          std::size_t elems = static_cast<std::size_t>(b - a) * job.row_elems;
          std::byte* dst = out.data() + static_cast<std::size_t>(a) * out_row;
          if (cast) {
            const std::byte* src = job.view ? job.view(a, b) : nullptr;
            if (!src) {
              scratch.resize(static_cast<std::size_t>(b - a) * in_row);
              job.gather(a, b, scratch.data());
              src = scratch.data();
            }
            native_cast(src, job.dtype, dst, job.out_dtype, elems);
          } else {
            job.gather(a, b, dst);
          }
          if (job.scan) counts[static_cast<std::size_t>(p)] += count_nonfinite(dst, job.out_dtype, elems);
          if (job.crc) {
            std::size_t bytes = static_cast<std::size_t>(b - a) * out_row;
            crcs[static_cast<std::size_t>(p)] = archive::crc32_update(crcs[static_cast<std::size_t>(p)], dst, bytes);
            lengths[static_cast<std::size_t>(p)] += bytes;
          }
        }
      });
    } else {
      buf.gathered.resize(static_cast<std::size_t>(job.rows) * in_row);
      for_each_range(job.rows, parts, [&](int, int64_t r0, int64_t r1) {
        job.gather(r0, r1, buf.gathered.data() + static_cast<std::size_t>(r0) * in_row);
      });
      cast_with_torch(buf.gathered.data(), job.dtype, out.data(), job.out_dtype, n);
      if (job.scan) counts[0] = scan_finite(out.data(), job.out_dtype, n);
      if (job.crc)
        for_each_range(job.rows, parts, [&](int p, int64_t r0, int64_t r1) {
          std::size_t bytes = static_cast<std::size_t>(r1 - r0) * out_row;
          crcs[static_cast<std::size_t>(p)] =
              archive::crc32_update(0, out.data() + static_cast<std::size_t>(r0) * out_row, bytes);
          lengths[static_cast<std::size_t>(p)] = bytes;
        });
    }
    SlabResult result;
    for (const auto& c : counts) result.finite += c;
    if (job.crc) {
      uint32_t crc = crcs[0];
      for (std::size_t p = 1; p < crcs.size(); ++p) crc = archive::crc32_combine(crc, crcs[p], lengths[p]);
      result.crc = crc;
    }
    if (job.keep_output) result.bytes = std::span<const std::byte>(out.data(), out.size());
    return result;
  }

 private:
  // The pairs float_cast.h does not cover (float8 sources).
  void cast_with_torch(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) {
    const CkptTorchApi& api = require_torch_plugin("dtype casts");
    if (const char* err = api.cast(src, static_cast<int>(from), dst, static_cast<int>(to), n, torch_threads_))
      fail(ErrorCode::kInternal, std::string("cast ") + std::string(dtype_name(from)) + " -> " +
                                     std::string(dtype_name(to)) + " failed: " + err);
  }

  // Rows gathered, cast and scanned per step of a fused pass: small enough
  // to stay in a core's cache between the three steps.
  static constexpr std::size_t kBlockBytes = 256u << 10;

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

const char* device_name(Device device) {
  switch (device) {
    case Device::kAuto: return "auto";
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
  }
  return "?";
}

}  // namespace ckpt
