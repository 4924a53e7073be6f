// Reader for torch.save zip archives (and any stored-only zip) over a
// ByteSource, also one embedded at an offset of a bigger file (a DCP item).
// Reads through the end-of-central-directory record and the central
// directory (ZIP64 included); never trusts local headers for sizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/byte_source.h"

namespace ckpt::archive {

struct ZipEntry {
  std::string name;          // full name, e.g. "archive/data/0"
  uint64_t data_offset = 0;  // offset of the first data byte, relative to the source
  uint64_t size = 0;         // uncompressed == compressed size (stored)
  uint32_t crc32 = 0;        // from the central directory
  uint16_t method = 0;       // 0 = stored; anything else is refused on read
};

class ZipReader {
 public:
  // Parses the central directory. DataLoss (naming source->describe()) for a
  // source that is not a zip, truncated records, sizes past the source end,
  // entry names that escape the archive ("../x", absolute paths), duplicates.
  explicit ZipReader(SourcePtr source);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(std::string_view full_name) const;
  // torch.save records live under one top folder ("archive/" or the file
  // stem): the folder name of the first entry.
  const std::string& prefix() const { return prefix_; }
  // find(prefix() + "/" + record)
  const ZipEntry* find_record(std::string_view record) const;
  // Like find_record; DataLoss naming the record when absent.
  const ZipEntry& record(std::string_view record) const;

  // The entry's bytes as a sub-source (no copy). Unimplemented, naming the
  // entry, if it is not stored.
  SourcePtr open(const ZipEntry& entry) const;
  std::string read(const ZipEntry& entry) const;
  // DataLoss naming the entry when its bytes do not match its CRC-32.
  void verify_crc(const ZipEntry& entry) const;

  const SourcePtr& source() const { return source_; }

 private:
  // Sorts by_name_ for find(); DataLoss on a duplicate name.
  void index_names();
  // DataLoss when two records' data overlap.
  void check_no_overlap() const;

  SourcePtr source_;
  std::vector<ZipEntry> entries_;
  std::vector<std::size_t> by_name_;  // indices into entries_, sorted by name
  std::string prefix_;
};

// True when the first bytes look like a zip local header ("PK\x03\x04").
bool looks_like_zip(const ByteSource& source);

}  // namespace ckpt::archive
