#include "check/tensor_scan.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "archive/zip_writer.h"
#include "core/error.h"
#include "exec/tensor_copy.h"
#include "io/byte_sink.h"
#include "model/repeated_dims.h"

namespace ckpt::check {
namespace {

constexpr std::size_t kSlice = std::size_t{256} << 10;

// Consumes the bytes append_tensor produces. Writes are whole elements in
// practice (rows, chunks); a split element is carried to the next write.
class ScanSink final : public ByteSink {
 public:
  ScanSink(DType dtype, Backend* backend, Hasher* hasher, RecordChecks* records, FileStreams* files)
      : dtype_(dtype),
        itemsize_(dtype_size(dtype)),
        backend_(backend),
        hasher_(hasher),
        records_(records),
        files_(files) {}

  using ByteSink::write;
  void write(const void* data, std::size_t n) override {
    position_ += n;
    if (hasher_) hasher_->update(data, n);
    if (!backend_) return;
    const auto* p = static_cast<const std::byte*>(data);
    if (!carry_.empty()) {
      std::size_t take = std::min(n, itemsize_ - carry_.size());
      carry_.insert(carry_.end(), p, p + take);
      p += take;
      n -= take;
      if (carry_.size() < itemsize_) return;
      counts_ += backend_->scan_finite(carry_.data(), dtype_, 1);
      carry_.clear();
    }
    std::size_t whole = n / itemsize_;
    if (whole) counts_ += backend_->scan_finite(p, dtype_, whole);
    carry_.assign(p + whole * itemsize_, p + n);
  }
  // Bytes of a file are read with pread into one reused slice buffer: a
  // single streaming pass costs a copy from the page cache, less than
  // faulting every page of a mapping in (and RSS stays one slice). Other
  // sources (zstd items in memory, HDF5) go through the default.
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override {
    if (pos > src.size() || n > src.size() - pos) fail_data_loss(src.describe() + ": copy range past the end");
    if (!src.file_span(pos)) return ByteSink::copy_from(src, pos, n);
    // A whole record streamed: its CRC-32 summed from the same buffer.
    bool summing = records_ && pos == 0 && n == src.size() && records_->claim(&src);
    uint32_t crc = 0;
    std::optional<FileStreams::Reading> announced;
    if (files_)
      if (auto at = src.file_span(pos)) announced.emplace(*files_, *at, n);
    buffer_.resize(static_cast<std::size_t>(std::min<uint64_t>(n, kSlice)));
    for (uint64_t done = 0; done < n;) {
      auto step = static_cast<std::size_t>(std::min<uint64_t>(n - done, kSlice));
      src.read_unmapped(pos + done, buffer_.data(), step);
      if (summing) crc = archive::crc32_update(crc, buffer_.data(), step);
      if (files_)
        if (auto at = src.file_span(pos + done)) files_->feed(*at, buffer_.data(), step);
      write(buffer_.data(), step);
      done += step;
    }
    if (summing) records_->done(&src, crc);
  }
  uint64_t position() const override { return position_; }
  const FiniteCounts& counts() const { return counts_; }

 private:
  DType dtype_;
  std::size_t itemsize_;
  Backend* backend_;
  Hasher* hasher_;
  RecordChecks* records_;
  FileStreams* files_;
  uint64_t position_ = 0;
  FiniteCounts counts_;
  std::vector<std::byte> carry_;
  std::vector<std::byte> buffer_;
};

}  // namespace

bool can_be_nonfinite(DType dtype) { return dtype_info(dtype).is_floating || dtype_info(dtype).is_complex; }

TensorScan scan_tensor(const TensorEntry& tensor, Backend* finite_backend, std::optional<ChecksumAlgorithm> checksum,
                       uint64_t memory_limit, RecordChecks* records, FileStreams* files) {
  if (tensor.out_dtype && *tensor.out_dtype != tensor.dtype)
    fail(ErrorCode::kInternal,
         "scan_tensor: tensor '" + tensor.name + "' has an output dtype; scans read stored values");
  Backend* backend = finite_backend && can_be_nonfinite(tensor.dtype) ? finite_backend : nullptr;
  std::optional<Hasher> hasher;
  if (checksum) hasher.emplace(*checksum);
  TensorScan out;
  if (!backend && !hasher) return out;
  // Counting needs each repeated value once (model/repeated_dims.h).
  if (std::vector<std::size_t> dims = repeated_dims(tensor); !hasher && !dims.empty()) {
    FiniteCounts once =
        *scan_tensor(without_dims(tensor, dims), backend, std::nullopt, memory_limit, records, files).finite;
    const uint64_t repeats = repeat_count(tensor.shape, dims);
    out.finite = FiniteCounts{once.nan * repeats, once.inf * repeats};
    return out;
  }
  ScanSink sink(tensor.dtype, backend, hasher ? &*hasher : nullptr, records, files);
  CopyOptions copy;
  copy.memory_limit = memory_limit;
  append_tensor(tensor, sink, copy);
  if (sink.position() != tensor.nbytes())
    fail(ErrorCode::kInternal, "scan of tensor '" + tensor.name + "' saw " + std::to_string(sink.position()) +
                                   " of its " + std::to_string(tensor.nbytes()) + " bytes");
  if (backend) out.finite = sink.counts();
  if (hasher) out.checksum = hasher->hex_digest();
  return out;
}

}  // namespace ckpt::check
