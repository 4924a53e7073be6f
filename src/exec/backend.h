// The arithmetic the executor needs on tensor bytes, behind one interface so
// that a CUDA implementation can replace the CPU one with identical results
// (docs/architecture.md, "The data path"). Buffers are host memory in every call: a device
// backend stages them itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
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

// One dim-0 slab of a tensor to assemble: `rows` rows of `row_elems`
// elements each, gathered from the tensor's chunks, optionally cast and
// scanned. A 0-dim tensor is one row of one element.
struct SlabJob {
  DType dtype = DType::kFloat32;      // of the gathered elements
  DType out_dtype = DType::kFloat32;  // == dtype: no cast
  int64_t rows = 0;
  uint64_t row_elems = 1;
  // Writes rows [r0, r1) of the slab (slab-relative), contiguous and
  // row-major in `dtype`, to dst. The executor knows the chunk geometry
  // (boxes, strides, sources); the backend decides how the rows are split
  // into pieces and threads, so it is called concurrently for disjoint ranges.
  std::function<void(int64_t r0, int64_t r1, std::byte* dst)> gather;
  // Rows [r0, r1) where they already lie contiguous and row-major in
  // `dtype` (a mapped source), else nullptr: a cast can read them there
  // instead of from a gathered copy. Optional; the same bookkeeping as
  // gather (a record's CRC-32 pieces), so a backend calls one or the other.
  std::function<const std::byte*(int64_t r0, int64_t r1)> view;
  bool scan = false;        // count NaN/Inf in the output
  bool keep_output = true;  // false: only the counts are wanted
  bool crc = false;         // also sum the output's CRC-32 (a zip record's), on the threads that made it
};

struct SlabResult {
  // rows * row_elems elements of out_dtype, owned by the backend; empty
  // when keep_output was false. Valid until the second assemble() after
  // this one: backends alternate between two buffers so that the executor
  // can write one slab while the next is assembled.
  std::span<const std::byte> bytes;
  FiniteCounts finite;  // of the output, when scan was set
  // The CRC-32 of `bytes`, when crc was set and the backend sums it (the
  // CPU one does, per block while it is in cache); else the writer does.
  std::optional<uint32_t> crc;
};

// Digests are not a device operation: xxh3 and SHA-256 (exec/checksum.h)
// are each one sequential stream over a file's bytes, each block depending
// on the state the previous left, so a device could only hash them more
// slowly than the host, which has the bytes in hand anyway when it writes
// them. CRC-32 is the exception that splits: pieces summed apart join with
// crc32_combine, so the CPU backend sums a zip record's slab on the threads
// that assembled it (SlabJob::crc); a backend that does not leaves it to the
// writer.
//
// cast() and scan_finite() may be called from several threads at once
// (validate's scan workers share one backend); a device backend serialises
// them itself. assemble()'s result buffers alternate, so its results are
// for one caller at a time.
class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", or "cuda:<index>".
  virtual std::string name() const = 0;
  // Converts n elements, rounding exactly as torch's Tensor.to(dtype) does.
  virtual void cast(const std::byte* src, DType from, std::byte* dst, DType to, std::size_t n) = 0;
  // Counts NaN and Inf among n elements. Integer and bool dtypes have none.
  virtual FiniteCounts scan_finite(const std::byte* data, DType dtype, std::size_t n) = 0;
  // Gathers one slab, casts it to job.out_dtype and counts NaN/Inf in the
  // result, in one pass over the slab (pipelined in pieces on a device).
  // Bit for bit the same output and counts on every backend.
  virtual SlabResult assemble(const SlabJob& job) = 0;
};

enum class Device { kAuto, kCpu, kCuda };

// The native CPU backend: scans run on `threads` threads (<= 0: all
// hardware threads); casts run on LibTorch's CPU kernels through the plugin,
// loaded on the first cast only (Unimplemented then if it cannot be loaded).
std::unique_ptr<Backend> make_cpu_backend(int threads);

// The backend for --device: kCpu, kCuda (InvalidArgument when this build or
// machine has no CUDA device), or kAuto (CUDA when available, else CPU).
// `threads` bounds the host threads either backend uses.
std::unique_ptr<Backend> make_backend(Device device, int threads);

// What kAuto resolves to on this machine, for --version: "cuda:0 (NVIDIA
// H200)", or "cpu" with the reason CUDA is not used.
std::string describe_auto_backend();

// "auto", "cpu", "cuda"; InvalidArgument otherwise.
Device parse_device(const std::string& text);
const char* device_name(Device device);

}  // namespace ckpt
