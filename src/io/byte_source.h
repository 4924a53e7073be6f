// Positional-read interface over a file, a memory buffer or a slice of
// another source (a torch.save zip embedded inside a .distcp file).
// Reads outside the source are corrupt input (DataLoss) naming the source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ckpt {

// Where a source's bytes live in an open file, for copy_file_range. File
// sources share a bounded pool of open descriptors (a checkpoint may have
// more files than a process may open: a Llama-7B universal checkpoint has
// ~1,200): `keep` holds this one open while the span lives, so use the
// span, never a copy of `fd`, after it is gone.
struct FileSpan {
  int fd;
  uint64_t offset;                   // absolute offset in fd of the source position asked for
  std::shared_ptr<const void> keep;  // the descriptor's lease
  // The file's identity as opened: two spans of one file have equal
  // (device, inode) whatever descriptor each went through.
  uint64_t device = 0;
  uint64_t inode = 0;
};

// The most file descriptors the sources of one process hold open at once,
// taken from RLIMIT_NOFILE when first asked (a quarter of it, at least 16
// and at most 1,024): the rest stay free for outputs, libraries and pipes.
std::size_t open_file_limit();

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly n bytes at pos; throws DataLoss if [pos, pos+n) is not inside.
  virtual void read(uint64_t pos, void* buf, std::size_t n) const = 0;
  // A human name for messages: the file path, with the slice when there is one.
  virtual std::string describe() const = 0;
  // Pointer to all bytes when they are in memory or mapped; nullptr otherwise.
  virtual const std::byte* data() const { return nullptr; }
  // The file holding byte `pos`, when the source is backed by one.
  virtual std::optional<FileSpan> file_span(uint64_t pos) const {
    (void)pos;
    return std::nullopt;
  }
  // A hint that [pos, pos+n) will not be read again soon: a mapped source
  // drops those pages from this process's resident set (the page cache
  // keeps them), so reading a checkpoint through mmap does not grow RSS
  // with its size.
  virtual void release(uint64_t pos, uint64_t n) const {
    (void)pos;
    (void)n;
  }

  // A hint that [pos, pos+n) will be read soon: an object-store source
  // starts fetching it in the background, in one request (io/s3_backend.cc),
  // so that a reader walking many small records (a DCP file's item headers)
  // has several requests on the wire instead of one at a time, and records
  // that lie close together cost one request. Others ignore it.
  virtual void prefetch(uint64_t pos, uint64_t n) const {
    (void)pos;
    (void)n;
  }

  // read(), but with pread from the file when the source has one, never
  // through a mapping: a streaming pass then costs a copy from the page
  // cache, not a page fault per page, and adds nothing to our RSS.
  void read_unmapped(uint64_t pos, void* buf, std::size_t n) const;

  std::vector<std::byte> read_vector(uint64_t pos, std::size_t n) const;
  std::string read_string(uint64_t pos, std::size_t n) const;

 protected:
  // Shared bounds check: DataLoss naming describe() when out of range.
  void check_range(uint64_t pos, uint64_t n) const;
};

using SourcePtr = std::shared_ptr<const ByteSource>;

// Opens a file for positional reads (pread), through the storage that holds
// it (io/storage.h, which defines these two). NotFound if missing.
SourcePtr open_file_source(const std::string& path);
// Maps a whole file read-only (falls back to pread for empty files).
SourcePtr open_mapped_source(const std::string& path);
// Owns a copy of the bytes.
SourcePtr make_memory_source(std::string bytes, std::string name = "<memory>");
// [offset, offset+length) of `parent`; DataLoss if that does not fit.
SourcePtr make_sub_source(SourcePtr parent, uint64_t offset, uint64_t length);

}  // namespace ckpt
