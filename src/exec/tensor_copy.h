// Streams one tensor, assembled from its chunks, as contiguous row-major
// bytes into one of two destinations: an open zip record (.pt) or a plain
// ByteSink (safetensors data, an HDF5 dataset filler). Bytes that need no
// change go from the source files to the output without a user-space copy
// (ZipWriter::append_from, ByteSink::copy_from); everything else is
// assembled in dim-0 slabs no larger than the memory budget by a Backend
// (gather + cast + NaN/Inf count in one pass per slab, on a device when the
// backend has one).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "archive/zip_writer.h"
#include "exec/backend.h"
#include "io/byte_sink.h"
#include "model/checkpoint_model.h"

namespace ckpt {

// The source records whose CRC-32 a job has checked, shared by every
// tensor it writes: a record is read and checked once, whatever number of
// tensors it feeds (a ZeRO flat partition feeds hundreds).
class RecordVerifier {
 public:
  // DataLoss naming the file, rank and tensor when a record `c` reads from
  // does not match its recorded CRC-32. Thread-safe.
  void verify(const TensorChunk& c, const std::string& tensor);
  // Bytes of the records these chunks read from that are not checked yet.
  uint64_t unchecked_bytes(const std::vector<const TensorChunk*>& chunks);
  bool checked(const ByteSource* record);
  // `crc` is the CRC-32 of all of c's record, summed elsewhere (while its
  // bytes were gathered): DataLoss as verify() when it differs, else the
  // record counts as checked.
  void accept(const TensorChunk& c, const std::string& tensor, uint32_t crc);

  // For jobs whose items each copy part of a record (reshard: an output
  // rank's rows span two source shards). A part copied unchanged is summed
  // by the copy that reads it (add_piece); the record counts as checked when
  // its parts tile it, across items and tensors, so it is not read again.
  // The job must call check_deferred() before publishing anything.
  void defer_partial_records() { defer_ = true; }
  bool deferring() const { return defer_; }
  // `crc`: the CRC-32 of bytes [offset, offset + n) of c's record.
  void add_piece(const TensorChunk& c, const std::string& tensor, uint64_t offset, uint64_t n, uint32_t crc);
  // Checks, by reading them whole, the records that got parts but are not
  // tiled yet. DataLoss as verify().
  void check_deferred();

 private:
  struct Piece {
    uint64_t offset, length;
    uint32_t crc;
  };
  struct Pending {
    TensorChunk chunk;
    std::string tensor;
    std::vector<Piece> pieces;
  };
  std::mutex mutex_;
  std::unordered_set<const ByteSource*> checked_;
  bool defer_ = false;
  std::map<const ByteSource*, Pending> pending_;
};

struct CopyOptions {
  uint64_t memory_limit = 256ull << 20;  // bytes of slab buffers in flight
  Backend* backend = nullptr;            // null: a CPU backend made for the call
  // When set, every tensor's output bytes are also scanned for NaN/Inf and
  // the counts reported here once per tensor (this sends every tensor
  // through the backend: the file-to-file copy never sees the bytes).
  std::function<void(const TensorEntry&, const FiniteCounts&)> on_finite;
  // Checks the CRC-32 of every source record a tensor is read from before
  // its bytes are used (consolidate, convert and reshard, unless
  // --no-verify): a flipped byte is exit 3, not a silently wrong output with
  // the stale CRC copied into it. Null: no check.
  std::shared_ptr<RecordVerifier> verify;
};

// Appends t.output_nbytes() bytes (cast to t.out_dtype when set). The model
// must have passed require_valid().
void append_tensor(const TensorEntry& t, archive::ZipWriter& zip, const CopyOptions& options);
void append_tensor(const TensorEntry& t, ByteSink& sink, const CopyOptions& options);

// Assembles rows [r0, r1) of dim 0 of `t` into `dst` as contiguous
// row-major bytes of t.dtype ((r1 - r0) * row bytes; r0 = 0, r1 = 1 for a
// 0-dim tensor), through the same gather as append_tensor. For readers of
// values rather than writers (diff); the caller bounds r1 - r0 by its budget
// and releases the chunks' sources when done with the tensor.
void assemble_rows(const TensorEntry& t, int64_t r0, int64_t r1, std::byte* dst);

// Copies the box `extent` from a strided source to a strided destination
// (strides in elements). Exposed for tests and the CUDA backend's reference.
void copy_box(const std::byte* src, const Shape& src_strides, std::byte* dst, const Shape& dst_strides,
              const Shape& extent, std::size_t itemsize);

}  // namespace ckpt
