// Reads a zip archive through its end records and central directory
// (PKWARE APPNOTE.TXT 6.3.x, section 4.3). All fields little-endian.
//
//   [local header 1][data 1][descriptor 1] ... [local header n][data n][descriptor n]
//   [central directory header 1 .. n]
//   [ZIP64 end of central directory record]     optional
//   [ZIP64 end of central directory locator]    optional, right before the EOCD
//   [end of central directory record][comment]  found by searching backwards
//
// End of central directory record (4.3.16), 22 bytes + comment:
//    0 u32 signature "PK\5\6"      10 u16 entries in total
//    4 u16 number of this disk     12 u32 central directory size
//    6 u16 disk where the CD is    16 u32 central directory offset
//    8 u16 entries on this disk    20 u16 comment length
//
// ZIP64 end of central directory locator (4.3.15), 20 bytes:
//    0 u32 signature "PK\6\7"      8 u64 offset of the ZIP64 EOCD record
//    4 u32 disk of that record    16 u32 total number of disks
//
// ZIP64 end of central directory record (4.3.14), 56 bytes (+ extensible data):
//    0 u32 signature "PK\6\6"     16 u32 number of this disk
//    4 u64 size of the rest (44+) 20 u32 disk where the CD is
//   12 u16 version made by        24 u64 entries on this disk    40 u64 CD size
//   14 u16 version needed         32 u64 entries in total        48 u64 CD offset
//
// Central directory header (4.3.12), 46 bytes + name + extra + comment:
//    0 u32 signature "PK\1\2"     16 u32 CRC-32                 32 u16 comment length
//    4 u16 version made by        20 u32 compressed size        34 u16 disk number start
//    6 u16 version needed         24 u32 uncompressed size      36 u16 internal attributes
//    8 u16 flags                  28 u16 name length            38 u32 external attributes
//   10 u16 method                 30 u16 extra length           42 u32 local header offset
//   12 u16 time, 14 u16 date
// A size or offset of 0xffffffff (disk 0xffff) is in the ZIP64 extended
// information extra field (id 0x0001, 4.5.3), which holds only the marked
// fields, as u64 (disk u32), in the order: uncompressed size, compressed
// size, local header offset, disk number start.
//
// Local file header (4.3.7), 30 bytes + name + extra, then the data:
//    0 u32 signature "PK\3\4"  ...  26 u16 name length  28 u16 extra length
// Only its lengths are used (to find the data); sizes come from the central
// directory, since torch's writer leaves them zero here (flag bit 3).
#include "archive/zip_reader.h"

#include <algorithm>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

#include "archive/zip_layout.h"
#include "archive/zip_writer.h"
#include "core/checked.h"
#include "core/error.h"

namespace ckpt::archive {
namespace {

constexpr std::size_t kMaxEocdSearch = kEocdSize + kMaxCommentSize;  // 65557
// miniz (torch's zip library) refuses central directories this big; so do we,
// before reading one into memory.
constexpr uint64_t kMaxCentralDirectorySize = 0xffffffff;

// An untrusted name, quoted, with bytes outside printable ASCII escaped.
std::string quoted(std::string_view name) {
  std::string out = "'";
  for (unsigned char c : name) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out + "'";
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

[[noreturn]] void fail_source(ErrorCode code, const ByteSource& src, const std::string& what) {
  fail(code, src.describe() + ": " + what);
}

[[noreturn]] void fail_entry(ErrorCode code, const ByteSource& src, std::string_view name, const std::string& what) {
  fail(code, src.describe() + ": entry " + quoted(name) + ": " + what);
}

// Bounds-checked little-endian fields of a record held in memory. Callers
// check has() where they can say more; take() past the end is still DataLoss.
class FieldReader {
 public:
  FieldReader(const unsigned char* data, std::size_t size, std::string where)
      : data_(data), size_(size), where_(std::move(where)) {}
  FieldReader(const std::string& bytes, std::string where)
      : FieldReader(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), std::move(where)) {}
  FieldReader(std::string&& bytes, std::string where) = delete;  // would dangle

  bool has(uint64_t n) const { return n <= size_ - pos_; }
  std::size_t position() const { return pos_; }
  void skip(std::size_t n) { take(n); }
  uint16_t u16() { return load_u16(take(2)); }
  uint32_t u32() { return load_u32(take(4)); }
  uint64_t u64() { return load_u64(take(8)); }
  std::string_view text(std::size_t n) { return {reinterpret_cast<const char*>(take(n)), n}; }
  FieldReader sub(std::size_t n, std::string where) { return FieldReader(take(n), n, std::move(where)); }

 private:
  const unsigned char* take(std::size_t n) {
    if (!has(n))
      fail_data_loss(where_ + ": truncated (" + std::to_string(n) + " bytes needed at byte " + std::to_string(pos_) +
                     " of " + std::to_string(size_) + ")");
    const unsigned char* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  const unsigned char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::string where_;
};

// Where the central directory is, from the end records.
struct EndRecords {
  uint64_t entries = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t cd_limit = 0;  // offset of the first end record: the directory ends before it
};

uint64_t find_eocd(const ByteSource& src) {
  const uint64_t size = src.size();
  if (size < kEocdSize)
    fail_source(ErrorCode::kDataLoss, src, "not a zip archive (" + std::to_string(size) + " bytes is too small)");
  const auto tail_len = static_cast<std::size_t>(std::min<uint64_t>(size, kMaxEocdSearch));
  const uint64_t tail_start = size - tail_len;
  const std::string tail = src.read_string(tail_start, tail_len);
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  // The last signature whose comment fits in the file wins.
  for (std::size_t pos = tail_len - kEocdSize + 1; pos-- > 0;) {
    if (load_u32(t + pos) == kEocdSignature && pos + kEocdSize + load_u16(t + pos + 20) <= tail_len)
      return tail_start + pos;
  }
  fail_source(
      ErrorCode::kDataLoss, src,
      "not a zip archive (no end of central directory record in the last " + std::to_string(tail_len) + " bytes)");
}

[[noreturn]] void fail_multi_disk(const ByteSource& src) {
  fail_source(ErrorCode::kUnimplemented, src, "zip archive spans several disks");
}

EndRecords read_zip64_end(const ByteSource& src, uint64_t locator_pos) {
  const std::string where = src.describe() + ": ZIP64 end of central directory";
  const std::string locator = src.read_string(locator_pos, kZip64LocatorSize);
  FieldReader loc(locator, where + " locator");
  loc.skip(4);
  const uint32_t record_disk = loc.u32();
  const uint64_t record_pos = loc.u64();
  const uint32_t disks = loc.u32();
  if (record_disk != 0 || disks > 1) fail_multi_disk(src);
  if (!range_fits(record_pos, kZip64EocdSize, locator_pos))
    fail_data_loss(where + ": record offset " + std::to_string(record_pos) + " is not before its locator at " +
                   std::to_string(locator_pos));
  const std::string record = src.read_string(record_pos, kZip64EocdSize);
  FieldReader rec(record, where);
  if (rec.u32() != kZip64EocdSignature)
    fail_data_loss(where + ": no record signature at offset " + std::to_string(record_pos));
  if (rec.u64() < kZip64EocdSize - 12) fail_data_loss(where + ": record size is smaller than 44 bytes");
  rec.skip(4);  // versions made by, needed
  const uint32_t disk = rec.u32();
  const uint32_t cd_disk = rec.u32();
  const uint64_t disk_entries = rec.u64();
  EndRecords end;
  end.entries = rec.u64();
  end.cd_size = rec.u64();
  end.cd_offset = rec.u64();
  end.cd_limit = record_pos;
  if (disk != 0 || cd_disk != 0 || disk_entries != end.entries) fail_multi_disk(src);
  return end;
}

EndRecords read_end_records(const ByteSource& src) {
  const uint64_t eocd = find_eocd(src);
  const std::string record = src.read_string(eocd, kEocdSize);
  FieldReader rec(record, src.describe() + ": end of central directory");
  rec.skip(4);
  const uint16_t disk = rec.u16();
  const uint16_t cd_disk = rec.u16();
  const uint16_t disk_entries = rec.u16();
  EndRecords end;
  end.entries = rec.u16();
  end.cd_size = rec.u32();
  end.cd_offset = rec.u32();
  end.cd_limit = eocd;
  // The ZIP64 records, when present, hold the true values (torch always writes them).
  unsigned char locator[4] = {};
  if (eocd >= kZip64LocatorSize) src.read(eocd - kZip64LocatorSize, locator, sizeof locator);
  if (load_u32(locator) == kZip64LocatorSignature) return read_zip64_end(src, eocd - kZip64LocatorSize);
  if (disk != 0 || cd_disk != 0 || disk_entries != end.entries) fail_multi_disk(src);
  return end;
}

void check_directory_bounds(const ByteSource& src, const EndRecords& end) {
  const std::string cd =
      "central directory (" + std::to_string(end.cd_size) + " bytes at offset " + std::to_string(end.cd_offset) + ")";
  if (!range_fits(end.cd_offset, end.cd_size, end.cd_limit))
    fail_source(ErrorCode::kDataLoss, src,
                cd + " does not end before the end records at offset " + std::to_string(end.cd_limit));
  if (end.cd_size > kMaxCentralDirectorySize)
    fail_source(ErrorCode::kResourceExhausted, src, cd + " is larger than 4 GiB");
  // Every entry takes at least a fixed header: refuse a count before reserving for it.
  if (end.entries > end.cd_size / kCentralHeaderSize)
    fail_source(ErrorCode::kDataLoss, src,
                "end of central directory claims " + std::to_string(end.entries) + " entries, but a " + cd +
                    " holds at most " + std::to_string(end.cd_size / kCentralHeaderSize));
}

// A central directory entry before its local header is read.
struct CentralEntry {
  ZipEntry entry;
  uint64_t compressed_size = 0;
  uint64_t header_offset = 0;
  uint16_t flags = 0;
  uint32_t disk = 0;
};

// Replaces the fields marked 0xffffffff (0xffff) by their ZIP64 values (4.5.3).
void apply_zip64_extra(const ByteSource& src, FieldReader extra, CentralEntry& c) {
  const std::string where = src.describe() + ": entry " + quoted(c.entry.name) + ": ZIP64 extra field";
  while (extra.has(4)) {
    const uint16_t id = extra.u16();
    const uint16_t len = extra.u16();
    if (!extra.has(len))
      fail_data_loss(src.describe() + ": entry " + quoted(c.entry.name) + ": extra field is truncated");
    FieldReader field = extra.sub(len, where);
    if (id != kZip64ExtraId) continue;
    if (c.entry.size == kZip64Marker32) c.entry.size = field.u64();
    if (c.compressed_size == kZip64Marker32) c.compressed_size = field.u64();
    if (c.header_offset == kZip64Marker32) c.header_offset = field.u64();
    if (c.disk == kZip64Marker16) c.disk = field.u32();
    return;
  }
}

CentralEntry parse_central_header(const ByteSource& src, FieldReader& cd, uint64_t index) {
  const std::string which = "central directory entry #" + std::to_string(index);
  if (!cd.has(kCentralHeaderSize)) fail_source(ErrorCode::kDataLoss, src, which + " is truncated");
  const std::size_t at = cd.position();
  if (cd.u32() != kCentralHeaderSignature)
    fail_source(ErrorCode::kDataLoss, src,
                which + " has no signature (byte " + std::to_string(at) + " of the directory)");
  cd.skip(4);  // versions made by, needed
  CentralEntry c;
  c.flags = cd.u16();
  c.entry.method = cd.u16();
  cd.skip(4);  // time, date
  c.entry.crc32 = cd.u32();
  c.compressed_size = cd.u32();
  c.entry.size = cd.u32();
  const uint16_t name_len = cd.u16();
  const uint16_t extra_len = cd.u16();
  const uint16_t comment_len = cd.u16();
  c.disk = cd.u16();
  cd.skip(6);  // internal, external attributes
  c.header_offset = cd.u32();
  if (!cd.has(uint64_t{name_len} + extra_len + comment_len))
    fail_source(ErrorCode::kDataLoss, src, which + ": name, extra field or comment runs past the directory");
  c.entry.name = std::string(cd.text(name_len));
  apply_zip64_extra(src, cd.sub(extra_len, which), c);
  cd.skip(comment_len);
  return c;
}

std::vector<CentralEntry> read_central_directory(const ByteSource& src, const EndRecords& end) {
  std::string owned;
  const unsigned char* bytes = nullptr;
  if (const std::byte* base = src.data()) {
    bytes = reinterpret_cast<const unsigned char*>(base) + end.cd_offset;
  } else {
    owned = src.read_string(end.cd_offset, static_cast<std::size_t>(end.cd_size));
    bytes = reinterpret_cast<const unsigned char*>(owned.data());
  }
  FieldReader cd(bytes, static_cast<std::size_t>(end.cd_size), src.describe() + ": central directory");
  std::vector<CentralEntry> out;
  out.reserve(static_cast<std::size_t>(end.entries));
  for (uint64_t i = 0; i < end.entries; ++i) out.push_back(parse_central_header(src, cd, i));
  return out;
}

// The safety policy for one entry: a name that stays inside the archive, a
// feature set we read, and data that lies inside the records area.
void check_entry(const ByteSource& src, const CentralEntry& c) {
  const std::string& name = c.entry.name;
  if (const char* why = name_escape_reason(name))
    fail_entry(ErrorCode::kDataLoss, src, name, std::string("name escapes the archive (") + why + ")");
  if (c.flags & kFlagEncrypted) fail_entry(ErrorCode::kUnimplemented, src, name, "is encrypted");
  if (c.disk != 0) fail_multi_disk(src);
  if (c.entry.method == kMethodStored && c.compressed_size != c.entry.size)
    fail_entry(ErrorCode::kDataLoss, src, name,
               "stored, but its compressed size " + std::to_string(c.compressed_size) + " differs from its size " +
                   std::to_string(c.entry.size));
}

// The data offset of an entry: after its local header's name and extra field.
uint64_t locate_data(const ByteSource& src, const CentralEntry& c, uint64_t data_limit) {
  const std::string& name = c.entry.name;
  const std::size_t header_len = kLocalHeaderSize + name.size();
  if (!range_fits(c.header_offset, header_len, data_limit))
    fail_entry(ErrorCode::kDataLoss, src, name,
               "local header offset " + std::to_string(c.header_offset) + " is past the records (which end at " +
                   std::to_string(data_limit) + ")");
  const std::string header = src.read_string(c.header_offset, header_len);
  FieldReader local(header, src.describe() + ": local header");
  if (local.u32() != kLocalHeaderSignature)
    fail_entry(ErrorCode::kDataLoss, src, name, "no local header at offset " + std::to_string(c.header_offset));
  local.skip(22);
  const uint16_t name_len = local.u16();
  const uint16_t extra_len = local.u16();
  if (name_len != name.size() || local.text(name.size()) != name)
    fail_entry(ErrorCode::kDataLoss, src, name, "local header holds a different name");
  const uint64_t data = c.header_offset + kLocalHeaderSize + name_len + extra_len;
  if (!range_fits(data, c.compressed_size, data_limit))
    fail_entry(ErrorCode::kDataLoss, src, name,
               std::to_string(c.compressed_size) + " bytes at offset " + std::to_string(data) +
                   " run past the records (which end at " + std::to_string(data_limit) + ")");
  return data;
}

}  // namespace

const char* name_escape_reason(std::string_view name) {
  if (name.empty()) return "empty name";
  if (name.front() == '/') return "absolute path";
  if (name.find('\\') != std::string_view::npos) return "backslash";
  if (name.find('\0') != std::string_view::npos) return "NUL byte";
  std::size_t start = 0;
  while (true) {
    const std::size_t end = name.find('/', start);
    const std::string_view part = name.substr(start, end == std::string_view::npos ? end : end - start);
    if (part.empty()) return "empty path component";
    if (part == "." || part == "..") return "'.' or '..' component";
    if (end == std::string_view::npos) return nullptr;
    start = end + 1;
  }
}

ZipReader::ZipReader(SourcePtr source) : source_(std::move(source)) {
  if (!source_) fail(ErrorCode::kInternal, "ZipReader: null source");
  const ByteSource& src = *source_;
  const EndRecords end = read_end_records(src);
  check_directory_bounds(src, end);
  std::vector<CentralEntry> central = read_central_directory(src, end);
  entries_.reserve(central.size());
  for (CentralEntry& c : central) {
    check_entry(src, c);
    c.entry.data_offset = locate_data(src, c, end.cd_offset);
    entries_.push_back(std::move(c.entry));
  }
  index_names();
  check_no_overlap();
  if (!entries_.empty()) {
    const std::string& first = entries_.front().name;
    const std::size_t slash = first.find('/');
    if (slash != std::string::npos) prefix_ = first.substr(0, slash);
  }
}

void ZipReader::check_no_overlap() const {
  // Two records sharing bytes would read as two copies of one data (a
  // crafted archive; torch.save never writes it).
  std::vector<const ZipEntry*> by_offset;
  for (const auto& e : entries_)
    if (e.size > 0) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ZipEntry* a, const ZipEntry* b) { return a->data_offset < b->data_offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const ZipEntry& prev = *by_offset[i - 1];
    const ZipEntry& cur = *by_offset[i];
    if (cur.data_offset < prev.data_offset + prev.size)
      fail_entry(ErrorCode::kDataLoss, *source_, cur.name,
                 "shares bytes with record '" + prev.name + "' (data at " + std::to_string(cur.data_offset) +
                     " inside [" + std::to_string(prev.data_offset) + ", +" + std::to_string(prev.size) + "))");
  }
}

void ZipReader::index_names() {
  by_name_.resize(entries_.size());
  for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [&](std::size_t a, std::size_t b) { return entries_[a].name < entries_[b].name; });
  auto dup = std::adjacent_find(by_name_.begin(), by_name_.end(),
                                [&](std::size_t a, std::size_t b) { return entries_[a].name == entries_[b].name; });
  if (dup != by_name_.end())
    fail_entry(ErrorCode::kDataLoss, *source_, entries_[*dup].name, "appears twice in the central directory");
}

const ZipEntry* ZipReader::find(std::string_view full_name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), full_name,
                             [&](std::size_t i, std::string_view name) { return entries_[i].name < name; });
  if (it == by_name_.end() || entries_[*it].name != full_name) return nullptr;
  return &entries_[*it];
}

const ZipEntry* ZipReader::find_record(std::string_view record) const {
  if (prefix_.empty()) return find(record);
  std::string full = prefix_;
  full += '/';
  full += record;
  return find(full);
}

const ZipEntry& ZipReader::record(std::string_view record) const {
  if (const ZipEntry* e = find_record(record)) return *e;
  fail_source(ErrorCode::kDataLoss, *source_,
              "record " + quoted(record) + " is missing from archive " + quoted(prefix_));
}

SourcePtr ZipReader::open(const ZipEntry& entry) const {
  if (entry.method != kMethodStored)
    fail_entry(ErrorCode::kUnimplemented, *source_, entry.name,
               "compression method " + std::to_string(entry.method) + " (only stored entries are read)");
  return make_sub_source(source_, entry.data_offset, entry.size);
}

std::string ZipReader::read(const ZipEntry& entry) const {
  SourcePtr bytes = open(entry);
  return bytes->read_string(0, static_cast<std::size_t>(entry.size));
}

void ZipReader::verify_crc(const ZipEntry& entry) const {
  uint32_t crc = crc32_of(*open(entry), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  if (crc != entry.crc32)
    fail_entry(ErrorCode::kDataLoss, *source_, entry.name,
               "CRC-32 mismatch (directory says " + hex32(entry.crc32) + ", data has " + hex32(crc) + ")");
}

bool looks_like_zip(const ByteSource& source) {
  if (source.size() < 4) return false;
  unsigned char magic[4];
  source.read(0, magic, 4);
  return load_u32(magic) == kLocalHeaderSignature;
}

}  // namespace ckpt::archive
