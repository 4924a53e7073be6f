// Writes zip archives byte for byte as torch.save does (PyTorchStreamWriter
// over miniz 3.0.2 with MZ_ZIP_FLAG_WRITE_ZIP64, built without a clock).
// PKWARE APPNOTE.TXT 6.3.x section numbers in brackets. All fields
// little-endian; offsets count from the archive's first byte (its position in
// the sink when the writer was made), so an archive can sit inside a bigger
// file (a DCP item).
//
// Per record:
//   local file header [4.3.7]
//      0 u32 "PK\3\4"   4 u16 version needed 0   6 u16 flags 0x0808 (0x0800 if empty)
//      8 u16 method 0  10 u16 time 0  12 u16 date 0  14 u32 CRC 0
//     18 u32 compressed size 0  22 u32 size 0  26 u16 name length  28 u16 extra length
//     30 name  "archive/data/0"
//        ZIP64 extra [4.5.3], only when size or offset >= 0xffffffff:
//          u16 0x0001, u16 len, [u64 size, u64 0 (miniz's compressed size)], [u64 header offset]
//        padding extra: u16 0x4246 "FB", u16 n, n bytes 'Z' (n puts the data on a 64-byte boundary)
//   data, stored
//   data descriptor [4.3.9], flag bit 3, absent for an empty record:
//      u32 "PK\7\8", u32 CRC, then u32 compressed size, u32 size
//      (u64, u64 when the local header has a ZIP64 extra)
//
// Then:
//   central directory header [4.3.12] per record:
//      0 u32 "PK\1\2"  4 u16 made by 0  6 u16 needed 0  8 u16 flags  10 u16 method 0
//     12 u32 time/date 0  16 u32 CRC  20 u32 compressed size  24 u32 size
//     28 u16 name length  30 u16 extra length  32 u16 comment length 0  34 u16 disk 0
//     36 u16 internal attributes 0  38 u32 external attributes 0  42 u32 header offset
//     46 name, ZIP64 extra (sizes and/or offset that do not fit 32 bits; those read 0xffffffff)
//   ZIP64 end of central directory record [4.3.14], always:
//      u32 "PK\6\6", u64 44, u16 made by 0x031e, u16 needed 0x002d, u32 disk 0, u32 CD disk 0,
//      u64 entries, u64 entries, u64 CD size, u64 CD offset
//   ZIP64 end of central directory locator [4.3.15]:
//      u32 "PK\6\7", u32 disk 0, u64 offset of the ZIP64 record, u32 disks 1
//   end of central directory record [4.3.16]:
//      u32 "PK\5\6", u16 0, u16 0, u16 entries, u16 entries (capped at 0xffff),
//      u32 CD size, u32 CD offset (capped at 0xffffffff), u16 comment length 0
#include "archive/zip_writer.h"

#include <algorithm>

#include "archive/zip_layout.h"
#include "core/error.h"

namespace ckpt::archive {
namespace {

constexpr uint64_t kDataAlignment = 64;
constexpr std::size_t kCopyBufferSize = std::size_t{4} << 20;
constexpr std::size_t kSummedSlice = std::size_t{256} << 10;  // fits in L2 beside the sink's page
constexpr uint16_t kZip64MadeBy = 0x031e;                     // what miniz writes: Unix, spec 3.0
constexpr uint16_t kZip64Needed = 0x002d;                     // spec 4.5: ZIP64

bool needs_zip64(uint64_t size, uint64_t offset) { return size >= kZip64Marker32 || offset >= kZip64Marker32; }

uint16_t record_flags(uint64_t size) {
  // miniz announces a data descriptor only for records with data.
  return size > 0 ? kFlagDataDescriptor | kFlagUtf8 : kFlagUtf8;
}

uint32_t cap32(uint64_t v) { return static_cast<uint32_t>(std::min<uint64_t>(v, kZip64Marker32)); }

// The ZIP64 extra field with only the values that do not fit 32 bits; empty
// when all fit. `compressed` is what goes in the compressed-size slot.
std::string zip64_extra(uint64_t size, uint64_t compressed, uint64_t offset) {
  if (!needs_zip64(size, offset)) return {};
  std::string values;
  if (size >= kZip64Marker32) {
    store_u64(values, size);
    store_u64(values, compressed);
  }
  if (offset >= kZip64Marker32) store_u64(values, offset);
  std::string out;
  store_u16(out, kZip64ExtraId);
  store_u16(out, static_cast<uint16_t>(values.size()));
  return out + values;
}

// The "FB" extra field that moves the data from `unpadded_start` (the data
// offset with an empty FB field) to the next 64-byte boundary.
std::string padding_extra(uint64_t unpadded_start) {
  const auto pad = static_cast<std::size_t>((kDataAlignment - unpadded_start % kDataAlignment) % kDataAlignment);
  std::string out;
  store_u16(out, kPaddingExtraId);
  store_u16(out, static_cast<uint16_t>(pad));
  out.append(pad, 'Z');
  return out;
}

std::string local_header(const std::string& name, uint64_t size, uint64_t offset) {
  // miniz puts 0 in the compressed-size slot of the local ZIP64 field.
  const std::string zip64 = zip64_extra(size, 0, offset);
  const std::string padding = padding_extra(offset + kLocalHeaderSize + name.size() + zip64.size() + 4);
  std::string out;
  store_u32(out, kLocalHeaderSignature);
  store_u16(out, 0);  // version needed: miniz writes 0 for stored records
  store_u16(out, record_flags(size));
  store_u16(out, kMethodStored);
  store_u32(out, 0);  // time, date
  store_u32(out, 0);  // CRC and sizes follow in the data descriptor
  store_u32(out, 0);
  store_u32(out, 0);
  store_u16(out, static_cast<uint16_t>(name.size()));
  store_u16(out, static_cast<uint16_t>(zip64.size() + padding.size()));
  return out + name + zip64 + padding;
}

std::string data_descriptor(uint64_t size, uint64_t offset, uint32_t crc) {
  std::string out;
  store_u32(out, kDataDescriptorSignature);
  store_u32(out, crc);
  if (needs_zip64(size, offset)) {
    store_u64(out, size);
    store_u64(out, size);
  } else {
    store_u32(out, static_cast<uint32_t>(size));
    store_u32(out, static_cast<uint32_t>(size));
  }
  return out;
}

std::string central_header(const std::string& name, uint64_t size, uint64_t offset, uint32_t crc) {
  const std::string zip64 = zip64_extra(size, size, offset);
  std::string out;
  store_u32(out, kCentralHeaderSignature);
  store_u16(out, 0);  // version made by
  store_u16(out, 0);  // version needed
  store_u16(out, record_flags(size));
  store_u16(out, kMethodStored);
  store_u32(out, 0);  // time, date
  store_u32(out, crc);
  store_u32(out, cap32(size));
  store_u32(out, cap32(size));
  store_u16(out, static_cast<uint16_t>(name.size()));
  store_u16(out, static_cast<uint16_t>(zip64.size()));
  store_u16(out, 0);  // comment length
  store_u16(out, 0);  // disk number start
  store_u16(out, 0);  // internal attributes
  store_u32(out, 0);  // external attributes
  store_u32(out, cap32(offset));
  return out + name + zip64;
}

std::string end_records(uint64_t entries, uint64_t cd_offset, uint64_t cd_size) {
  std::string out;
  store_u32(out, kZip64EocdSignature);
  store_u64(out, kZip64EocdSize - 12);  // the record after its size field
  store_u16(out, kZip64MadeBy);
  store_u16(out, kZip64Needed);
  store_u32(out, 0);  // this disk
  store_u32(out, 0);  // disk with the central directory
  store_u64(out, entries);
  store_u64(out, entries);
  store_u64(out, cd_size);
  store_u64(out, cd_offset);

  store_u32(out, kZip64LocatorSignature);
  store_u32(out, 0);                    // disk with the ZIP64 record
  store_u64(out, cd_offset + cd_size);  // the ZIP64 record follows the directory
  store_u32(out, 1);                    // total disks

  store_u32(out, kEocdSignature);
  store_u16(out, 0);
  store_u16(out, 0);
  store_u16(out, static_cast<uint16_t>(std::min<uint64_t>(entries, kZip64Marker16)));
  store_u16(out, static_cast<uint16_t>(std::min<uint64_t>(entries, kZip64Marker16)));
  store_u32(out, cap32(cd_size));
  store_u32(out, cap32(cd_offset));
  store_u16(out, 0);  // comment length
  return out;
}

}  // namespace

ZipWriter::ZipWriter(ByteSink& sink, std::string archive_name)
    : sink_(sink), archive_name_(std::move(archive_name)), base_(sink.position()) {
  if (archive_name_.find('/') != std::string::npos || name_escape_reason(archive_name_))
    fail_invalid("zip archive name '" + archive_name_ + "' is not a single folder name");
}

void ZipWriter::write_record(std::string_view record, const void* data, std::size_t n) {
  begin_record(record, n);
  append(data, n);
  end_record();
}

void ZipWriter::begin_record(std::string_view record, uint64_t size) {
  std::string name = archive_name_ + "/" + std::string(record);
  if (finished_) fail(ErrorCode::kInternal, "zip record '" + name + "' begun after finish()");
  if (in_record_)
    fail(ErrorCode::kInternal, "zip record '" + name + "' begun while '" + written_.back().name + "' is open");
  if (const char* why = name_escape_reason(name))
    fail_invalid("zip record name '" + name + "' escapes the archive (" + why + ")");
  if (name.size() > 0xffff) fail_invalid("zip record name '" + name.substr(0, 64) + "...' is longer than 65535 bytes");
  if (!names_.insert(name).second) fail_invalid("zip record '" + name + "' is written twice");
  const uint64_t offset = sink_.position() - base_;
  sink_.write(local_header(name, size, offset));
  written_.push_back({std::move(name), offset, size, 0});
  in_record_ = true;
  expected_ = size;
  appended_ = 0;
  crc_ = 0;
}

void ZipWriter::check_append(uint64_t n) const {
  if (!in_record_) fail(ErrorCode::kInternal, "zip append outside a record");
  if (n > expected_ - appended_)
    fail(ErrorCode::kInternal, "zip record '" + written_.back().name + "': appending " + std::to_string(n) +
                                   " bytes after " + std::to_string(appended_) + " overruns its declared " +
                                   std::to_string(expected_));
}

void ZipWriter::append(const void* data, std::size_t n) {
  check_append(n);
  sink_.write(data, n);
  crc_ = crc32_update(crc_, data, n);
  appended_ += n;
}

void ZipWriter::append(const void* data, std::size_t n, uint32_t crc) {
  check_append(n);
  sink_.write(data, n);
  crc_ = crc32_combine(crc_, crc, n);
  appended_ += n;
}

void ZipWriter::append_from(const ByteSource& source, uint64_t pos, uint64_t n, std::optional<uint32_t> known_crc,
                            uint32_t* crc_out) {
  check_append(n);
  if (known_crc) {
    sink_.copy_from(source, pos, n);
    crc_ = crc32_combine(crc_, *known_crc, n);
    appended_ += n;
    if (crc_out) *crc_out = *known_crc;
    return;
  }
  const uint32_t piece = copy_summing(source, pos, n, sink_);
  crc_ = crc32_combine(crc_, piece, n);
  appended_ += n;
  if (crc_out) *crc_out = piece;
}

uint32_t copy_summing(const ByteSource& src, uint64_t pos, uint64_t n, ByteSink& sink) {
  // A mapped source is summed and written from the mapping a slice at a
  // time, the slice still in cache when write() copies it: the one copy a
  // kernel copy would make (copy_file_range), where a copy and a separate
  // check cost two and a buffer here three.
  if (const std::byte* mapped = src.data()) {
    uint32_t crc = 0;
    for (uint64_t done = 0; done < n;) {
      const auto chunk = static_cast<std::size_t>(std::min<uint64_t>(n - done, kSummedSlice));
      crc = crc32_update(crc, mapped + pos + done, chunk);
      sink.write(mapped + pos + done, chunk);
      src.release(pos + done, chunk);
      done += chunk;
    }
    return crc;
  }
  std::string buffer(static_cast<std::size_t>(std::min<uint64_t>(n, kCopyBufferSize)), '\0');
  uint32_t crc = 0;
  for (uint64_t done = 0; done < n;) {
    const auto chunk = static_cast<std::size_t>(std::min<uint64_t>(n - done, buffer.size()));
    src.read(pos + done, buffer.data(), chunk);
    src.release(pos + done, chunk);  // read once: a mapping's pages need not stay in our RSS
    sink.write(buffer.data(), chunk);
    crc = crc32_update(crc, buffer.data(), chunk);
    done += chunk;
  }
  return crc;
}

void ZipWriter::append_elsewhere(uint64_t n, uint32_t crc) {
  check_append(n);
  sink_.skip(n);
  crc_ = crc32_combine(crc_, crc, n);
  appended_ += n;
}

void ZipWriter::end_record() {
  if (!in_record_) fail(ErrorCode::kInternal, "zip end_record() without begin_record()");
  Written& record = written_.back();
  if (appended_ != expected_)
    fail(ErrorCode::kInternal, "zip record '" + record.name + "' ended after " + std::to_string(appended_) +
                                   " of its declared " + std::to_string(expected_) + " bytes");
  record.crc = crc_;
  if (record.size > 0) sink_.write(data_descriptor(record.size, record.header_offset, record.crc));
  in_record_ = false;
}

void ZipWriter::finish() {
  if (finished_) fail(ErrorCode::kInternal, "zip finish() called twice");
  if (in_record_) fail(ErrorCode::kInternal, "zip finish() while record '" + written_.back().name + "' is open");
  const uint64_t cd_offset = sink_.position() - base_;
  for (const Written& w : written_) sink_.write(central_header(w.name, w.size, w.header_offset, w.crc));
  const uint64_t cd_size = sink_.position() - base_ - cd_offset;
  sink_.write(end_records(written_.size(), cd_offset, cd_size));
  finished_ = true;
}

}  // namespace ckpt::archive
