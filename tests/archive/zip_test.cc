#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "archive/zip_reader.h"
#include "archive/zip_writer.h"
#include "core/checked.h"
#include "core/error.h"
#include "io/byte_sink.h"
#include "io/byte_source.h"

using namespace ckpt;
using namespace ckpt::archive;

namespace {

// Little-endian patching, written independently of the implementation's helpers.
void put_le(std::string& bytes, std::size_t at, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) bytes[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
uint64_t get_le(const std::string& bytes, std::size_t at, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return v;
}

std::string floats_le(std::initializer_list<float> values) {
  std::string out;
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    std::string word(4, '\0');
    put_le(word, 0, bits, 4);
    out += word;
  }
  return out;
}

// A small archive as ckptconv writes a torch.save file.
std::string torch_like_archive(const std::string& folder = "archive") {
  MemorySink sink;
  ZipWriter zip(sink, folder);
  zip.write_record("data.pkl", std::string("\x80\x02}q\x00.", 6));
  zip.write_record(".format_version", std::string("1"));
  zip.write_record(".storage_alignment", std::string("64"));
  zip.write_record("byteorder", std::string("little"));
  zip.write_record("data/0", floats_le({1.0f, 2.0f, 3.0f}));
  zip.write_record("data/1", std::string());
  zip.write_record("version", std::string("3\n"));
  zip.finish();
  return sink.take();
}

struct PlainFile {
  std::string name;
  std::string data;
  uint16_t method = 0;
};

// A minimal zip as most tools write one: sizes in the local header, no data
// descriptors, no padding, no ZIP64 records.
std::string plain_zip(const std::vector<PlainFile>& files) {
  std::string out, cd;
  for (const PlainFile& f : files) {
    const std::size_t at = out.size();
    const uint32_t crc = crc32_update(0, f.data.data(), f.data.size());
    std::string h(30, '\0');
    put_le(h, 0, 0x04034b50, 4);
    put_le(h, 8, f.method, 2);
    put_le(h, 14, crc, 4);
    put_le(h, 18, f.data.size(), 4);
    put_le(h, 22, f.data.size(), 4);
    put_le(h, 26, f.name.size(), 2);
    out += h + f.name + f.data;
    std::string c(46, '\0');
    put_le(c, 0, 0x02014b50, 4);
    put_le(c, 10, f.method, 2);
    put_le(c, 16, crc, 4);
    put_le(c, 20, f.data.size(), 4);
    put_le(c, 24, f.data.size(), 4);
    put_le(c, 28, f.name.size(), 2);
    put_le(c, 42, at, 4);
    cd += c + f.name;
  }
  std::string eocd(22, '\0');
  put_le(eocd, 0, 0x06054b50, 4);
  put_le(eocd, 8, files.size(), 2);
  put_le(eocd, 10, files.size(), 2);
  put_le(eocd, 12, cd.size(), 4);
  put_le(eocd, 16, out.size(), 4);
  return out + cd + eocd;
}

ZipReader read_bytes(std::string bytes, const std::string& name = "test.pt") {
  return ZipReader(make_memory_source(std::move(bytes), name));
}

// Opens the archive and reads and verifies every entry, as a consumer would.
void read_everything(std::string bytes) {
  ZipReader zip = read_bytes(std::move(bytes));
  for (const ZipEntry& e : zip.entries()) {
    zip.read(e);
    zip.verify_crc(e);
  }
}

// The error `fn` throws; fails the test when it throws none.
template <class Fn>
Error error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no ckpt::Error thrown");
  throw std::logic_error("unreachable");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::size_t central_header_of(const std::string& bytes, const std::string& name) {
  std::size_t at = bytes.find(std::string("PK\x01\x02", 4));
  while (at != std::string::npos) {
    const auto name_len = static_cast<std::size_t>(get_le(bytes, at + 28, 2));
    if (bytes.compare(at + 46, name_len, name) == 0 && name_len == name.size()) return at;
    at = bytes.find(std::string("PK\x01\x02", 4), at + 1);
  }
  FAIL("no central header for " << name);
  return 0;
}

// Holds the bytes written to it except those moved by copy_from, which it
// remembers as holes of zeros: lets a test write a >4 GiB archive in memory.
class SparseSink final : public ByteSink {
 public:
  using ByteSink::write;
  void write(const void* data, std::size_t n) override {
    pieces_[size_] = std::string(static_cast<const char*>(data), n);
    size_ += n;
  }
  uint64_t position() const override { return size_; }
  void copy_from(const ByteSource& src, uint64_t pos, uint64_t n) override {
    REQUIRE(range_fits(pos, n, src.size()));
    size_ += n;  // a hole: reads back as zeros
  }
  const std::map<uint64_t, std::string>& pieces() const { return pieces_; }

 private:
  std::map<uint64_t, std::string> pieces_;
  uint64_t size_ = 0;
};

class SparseSource final : public ByteSource {
 public:
  explicit SparseSource(const SparseSink& sink) : pieces_(sink.pieces()), size_(sink.position()) {}
  uint64_t size() const override { return size_; }
  std::string describe() const override { return "sparse"; }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    auto* out = static_cast<char*>(buf);
    std::memset(out, 0, n);
    for (const auto& [at, bytes] : pieces_) {
      const uint64_t lo = std::max(at, pos), hi = std::min(at + bytes.size(), pos + n);
      if (lo < hi) std::memcpy(out + (lo - pos), bytes.data() + (lo - at), hi - lo);
    }
  }

 private:
  std::map<uint64_t, std::string> pieces_;
  uint64_t size_;
};

class ZeroSource final : public ByteSource {
 public:
  explicit ZeroSource(uint64_t size) : size_(size) {}
  uint64_t size() const override { return size_; }
  std::string describe() const override { return "zeros"; }
  void read(uint64_t pos, void* buf, std::size_t n) const override {
    check_range(pos, n);
    std::memset(buf, 0, n);
  }

 private:
  uint64_t size_;
};

}  // namespace

TEST_CASE("zip round trip: every record comes back with its bytes and CRC", "[archive]") {
  ZipReader zip = read_bytes(torch_like_archive());
  REQUIRE(zip.entries().size() == 7);
  CHECK(zip.prefix() == "archive");
  CHECK(zip.entries()[0].name == "archive/data.pkl");
  CHECK(zip.read(zip.record("data/0")) == floats_le({1.0f, 2.0f, 3.0f}));
  CHECK(zip.read(zip.record("byteorder")) == "little");
  CHECK(zip.read(zip.record("version")) == "3\n");
  CHECK(zip.record("data/1").size == 0);
  CHECK(zip.read(zip.record("data/1")).empty());
  CHECK(zip.record("data/0").crc32 == crc32_update(0, floats_le({1.0f, 2.0f, 3.0f}).data(), 12));
  for (const ZipEntry& e : zip.entries()) {
    CHECK(e.method == 0);
    CHECK_NOTHROW(zip.verify_crc(e));
  }
  CHECK(zip.find("archive/version") == &zip.record("version"));
  CHECK(zip.find("archive/nope") == nullptr);
  CHECK(zip.find_record("nope") == nullptr);
  CHECK(zip.open(zip.record("data/0"))->read_string(4, 4) == floats_le({2.0f}));
}

TEST_CASE("zip writer puts every record's data on a 64-byte boundary", "[archive]") {
  // Names of every length 1..70 move the header end through all residues.
  MemorySink sink;
  ZipWriter zip(sink);
  for (int len = 1; len <= 70; ++len) zip.write_record(std::string(len, 'n'), std::string(len % 5, 'x'));
  zip.finish();
  ZipReader reader = read_bytes(sink.take());
  REQUIRE(reader.entries().size() == 70);
  for (const ZipEntry& e : reader.entries()) {
    INFO(e.name);
    CHECK(e.data_offset % 64 == 0);
    CHECK(reader.read(e) == std::string((e.name.size() - 8) % 5, 'x'));
  }
}

TEST_CASE("zip reader reads a file written by torch.save", "[archive]") {
  ZipReader zip(open_file_source(CKPT_SOURCE_DIR "/tests/archive/data/torch_small.pt"));
  CHECK(zip.prefix() == "torch_small");
  std::vector<std::string> names;
  for (const ZipEntry& e : zip.entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"torch_small/data.pkl", "torch_small/.format_version",
                                          "torch_small/.storage_alignment", "torch_small/byteorder",
                                          "torch_small/data/0", "torch_small/data/1", "torch_small/version",
                                          "torch_small/.data/serialization_id"});
  // {'w': tensor([1.5, -2.0, 3.25]), 'e': empty(0), 'step': 7}
  CHECK(zip.read(zip.record("data/0")) == floats_le({1.5f, -2.0f, 3.25f}));
  CHECK(zip.record("data/1").size == 0);
  CHECK(zip.read(zip.record("version")) == "3\n");
  CHECK(zip.read(zip.record("byteorder")) == "little");
  CHECK(zip.read(zip.record(".storage_alignment")) == "64");
  CHECK(zip.read(zip.record("data.pkl")).substr(0, 2) == "\x80\x02");
  CHECK(zip.record("data.pkl").size == 233);
  for (const ZipEntry& e : zip.entries()) {
    CHECK(e.data_offset % 64 == 0);
    CHECK_NOTHROW(zip.verify_crc(e));
  }
}

TEST_CASE("zip writer reproduces a torch.save file byte for byte", "[archive]") {
  ZipReader original(open_file_source(CKPT_SOURCE_DIR "/tests/archive/data/torch_small.pt"));
  MemorySink sink;
  ZipWriter zip(sink, "torch_small");
  for (const ZipEntry& e : original.entries()) {
    const std::string record = e.name.substr(original.prefix().size() + 1);
    if (e.size % 2 == 0) {
      zip.write_record(record, original.read(e));
    } else {  // the streaming path, with the CRC taken from the source directory
      zip.begin_record(record, e.size);
      zip.append_from(*original.source(), e.data_offset, e.size, e.crc32);
      zip.end_record();
    }
  }
  zip.finish();
  const std::string& torch_bytes = original.source()->read_string(0, original.source()->size());
  REQUIRE(sink.bytes().size() == torch_bytes.size());
  CHECK(sink.bytes() == torch_bytes);
}

TEST_CASE("zip writer streams pieces and sources, computing or combining CRCs", "[archive]") {
  std::string big(5 * 1024 * 1024 + 17, '\0');  // over the 4 MiB copy buffer
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  auto source = make_memory_source(big, "big");
  MemorySink sink;
  ZipWriter zip(sink);
  zip.begin_record("data/0", big.size() + 3);
  zip.append("abc", 3);
  zip.append_from(*source, 0, big.size());  // reads and computes the CRC
  zip.end_record();
  zip.begin_record("data/1", 100);
  zip.append_from(*source, 10, 60, crc32_update(0, big.data() + 10, 60));  // known CRC
  zip.append_from(*source, 70, 40);
  zip.end_record();
  zip.finish();
  ZipReader reader = read_bytes(sink.take());
  CHECK(reader.read(reader.record("data/0")) == "abc" + big);
  CHECK(reader.read(reader.record("data/1")) == big.substr(10, 100));
  CHECK_NOTHROW(reader.verify_crc(reader.record("data/0")));
  CHECK_NOTHROW(reader.verify_crc(reader.record("data/1")));
  CHECK(crc32_combine(crc32_update(0, "ab", 2), crc32_update(0, "cd", 2), 2) == crc32_update(0, "abcd", 4));
}

TEST_CASE("zip CRC verification catches a flipped data byte", "[archive]") {
  std::string bytes = torch_like_archive();
  const uint64_t at = read_bytes(bytes).record("data/0").data_offset + 5;
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  ZipReader zip = read_bytes(bytes, "flipped.pt");
  CHECK_NOTHROW(zip.verify_crc(zip.record("version")));
  Error e = error_of([&] { zip.verify_crc(zip.record("data/0")); });
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.what(), "flipped.pt"));
  CHECK(contains(e.what(), "'archive/data/0'"));
  CHECK(contains(e.what(), "CRC-32 mismatch"));
}

TEST_CASE("zip reader reads an archive embedded at an offset of a bigger source", "[archive]") {
  const std::string archive = torch_like_archive();
  const std::string head(1000, 'h'), tail(333, 't');
  auto whole = make_memory_source(head + archive + tail, "item.distcp");
  ZipReader zip(make_sub_source(whole, head.size(), archive.size()));
  CHECK(zip.entries().size() == 7);
  CHECK(zip.read(zip.record("data/0")) == floats_le({1.0f, 2.0f, 3.0f}));
  CHECK(zip.record("data/0").data_offset % 64 == 0);  // relative to the item
  CHECK_NOTHROW(zip.verify_crc(zip.record("data/0")));
}

TEST_CASE("zip writer appended to a non-empty sink counts offsets from the archive start", "[archive]") {
  MemorySink sink;
  sink.write(std::string(77, 'x'));
  ZipWriter zip(sink);
  zip.write_record("data/0", floats_le({4.0f}));
  zip.finish();
  const std::string all = sink.take();
  ZipReader reader(make_sub_source(make_memory_source(all, "cat"), 77, all.size() - 77));
  CHECK(reader.read(reader.record("data/0")) == floats_le({4.0f}));
  CHECK(reader.record("data/0").data_offset % 64 == 0);
}

TEST_CASE("zip ZIP64 fields: a record over 4 GiB and offsets past 4 GiB", "[archive]") {
  const uint64_t big = (uint64_t{1} << 32) + 10;
  ZeroSource zeros(big);
  SparseSink sink;
  ZipWriter zip(sink);
  zip.write_record("version", std::string("3\n"));
  zip.begin_record("data/0", big);
  zip.append_from(zeros, 0, big, 0x12345678);
  zip.end_record();
  zip.write_record("byteorder", std::string("little"));  // header offset past 4 GiB
  zip.finish();
  ZipReader reader(std::make_shared<SparseSource>(sink));
  REQUIRE(reader.entries().size() == 3);
  const ZipEntry& data = reader.record("data/0");
  CHECK(data.size == big);
  CHECK(data.crc32 == 0x12345678);
  CHECK(data.data_offset % 64 == 0);
  const ZipEntry& order = reader.record("byteorder");
  CHECK(order.data_offset > big);
  CHECK(order.data_offset % 64 == 0);
  CHECK(reader.read(order) == "little");
  CHECK_NOTHROW(reader.verify_crc(order));
  // The big record's descriptor carries 64-bit sizes: "PK\7\8", CRC, u64, u64.
  std::string descriptor(24, '\0');
  reader.source()->read(data.data_offset + big, descriptor.data(), 24);
  CHECK(get_le(descriptor, 0, 4) == 0x08074b50);
  CHECK(get_le(descriptor, 8, 8) == big);
  CHECK(get_le(descriptor, 16, 8) == big);
}

TEST_CASE("zip reader reads plain zips without ZIP64 records or descriptors", "[archive]") {
  ZipReader zip = read_bytes(plain_zip({{"pkg/a", "hello"}, {"pkg/b/c", ""}}));
  CHECK(zip.prefix() == "pkg");
  CHECK(zip.read(zip.record("a")) == "hello");
  CHECK(zip.record("b/c").size == 0);
  CHECK_NOTHROW(zip.verify_crc(zip.record("a")));
  ZipReader flat = read_bytes(plain_zip({{"top", "x"}}));
  CHECK(flat.prefix().empty());
  CHECK(flat.read(flat.record("top")) == "x");
}

TEST_CASE("zip entry names that escape the archive are refused, the rest kept", "[archive]") {
  const std::vector<std::string> unsafe = {"../x", "a/../x", "a/..", "/x",    "a\\b",
                                           "a//b", "a/",     "./a",  "a/./b", std::string("a\0b", 3)};
  for (const std::string& bad : unsafe) {
    INFO(bad);
    Error e = error_of([&] { read_bytes(plain_zip({{"pkg/ok", "1"}, {bad, "2"}}), "evil.pt"); });
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(contains(e.what(), "evil.pt"));
    CHECK(contains(e.what(), "escapes the archive"));
  }
  for (const std::string fine : {"a", "a/..b", "a/b..", "a/.x", "...", "a/b/c/d"}) {
    INFO(fine);
    CHECK_NOTHROW(read_bytes(plain_zip({{fine, "1"}})));
  }
}

TEST_CASE("zip hostile: an entry named ../x in a torch-style archive", "[archive]") {
  std::string bytes = torch_like_archive();
  // Rename archive/data/0 to archive/../x/0 in both the local and central header.
  for (std::size_t at = bytes.find("archive/data/0"); at != std::string::npos; at = bytes.find("archive/data/0", at))
    bytes.replace(at, 14, "archive/../x/0");
  Error e = error_of([&] { read_bytes(bytes, "evil.pt"); });
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(std::string(e.what()) == "evil.pt: entry 'archive/../x/0': name escapes the archive ('.' or '..' component)");
}

TEST_CASE("zip hostile: truncated at every byte", "[archive]") {
  const std::string bytes = torch_like_archive();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " bytes");
    CHECK_THROWS_AS(read_everything(bytes.substr(0, n)), Error);
  }
}

TEST_CASE("zip hostile: any single corrupted byte is read or refused, never a crash", "[archive]") {
  const std::string bytes = torch_like_archive();
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    for (unsigned char flip : {0x01, 0x80, 0xff}) {
      std::string bad = bytes;
      bad[at] = static_cast<char>(bad[at] ^ flip);
      try {
        read_everything(bad);
      } catch (const Error&) {
        // refused: fine
      }
    }
  }
}

TEST_CASE("zip hostile: a record longer than the file", "[archive]") {
  std::string bytes = torch_like_archive();
  const std::size_t cd = central_header_of(bytes, "archive/data/0");
  put_le(bytes, cd + 20, 0x7fffffff, 4);
  put_le(bytes, cd + 24, 0x7fffffff, 4);
  Error e = error_of([&] { read_bytes(bytes, "long.pt"); });
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.what(), "long.pt: entry 'archive/data/0': 2147483647 bytes at offset"));
}

TEST_CASE("zip entry data may end exactly at the central directory, not one byte later", "[archive]") {
  std::string bytes = plain_zip({{"pkg/a", "hello"}});
  CHECK(read_bytes(bytes).record("a").size == 5);
  const std::size_t cd = central_header_of(bytes, "pkg/a");
  put_le(bytes, cd + 20, 6, 4);
  put_le(bytes, cd + 24, 6, 4);
  Error e = error_of([&] { read_bytes(bytes); });
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(std::string(e.what()) == "test.pt: entry 'pkg/a': 6 bytes at offset 35 run past the records (which end at 40)");
}

TEST_CASE("zip hostile: end of central directory with an absurd entry count", "[archive]") {
  std::string plain = plain_zip({{"pkg/a", "hello"}});
  put_le(plain, plain.size() - 22 + 8, 0xffff, 2);
  put_le(plain, plain.size() - 22 + 10, 0xffff, 2);
  Error e = error_of([&] { read_bytes(plain, "count.pt"); });
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.what(), "count.pt: end of central directory claims 65535 entries"));

  std::string torch = torch_like_archive();
  const std::size_t zip64 = torch.size() - 22 - 20 - 56;
  REQUIRE(get_le(torch, zip64, 4) == 0x06064b50);
  put_le(torch, zip64 + 24, uint64_t{1} << 62, 8);
  put_le(torch, zip64 + 32, uint64_t{1} << 62, 8);
  e = error_of([&] { read_bytes(torch, "count.pt"); });
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(contains(e.what(), "claims 4611686018427387904 entries"));
}

TEST_CASE("zip hostile: not a zip at all", "[archive]") {
  const std::vector<std::string> junks = {std::string(), "PK", std::string(21, '\0'), std::string(5000, 'x'),
                                          "PYTORCH1" + std::string(100, '\0')};
  for (const std::string& junk : junks) {
    Error e = error_of([&] { read_bytes(junk, "junk.bin"); });
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(contains(e.what(), "junk.bin: not a zip archive"));
    CHECK_FALSE(looks_like_zip(*make_memory_source(junk)));
  }
  CHECK(looks_like_zip(*make_memory_source(torch_like_archive())));
}

TEST_CASE("zip hostile: duplicate names, wrong local header, compressed entries", "[archive]") {
  Error dup = error_of([&] { read_bytes(plain_zip({{"pkg/a", "1"}, {"pkg/b", "2"}, {"pkg/a", "3"}})); });
  CHECK(dup.code() == ErrorCode::kDataLoss);
  CHECK(std::string(dup.what()) == "test.pt: entry 'pkg/a': appears twice in the central directory");

  std::string moved = plain_zip({{"pkg/a", "hello"}});
  put_le(moved, 0, 0x04034b51, 4);
  CHECK(contains(error_of([&] { read_bytes(moved); }).what(), "entry 'pkg/a': no local header at offset 0"));

  std::string renamed = plain_zip({{"pkg/a", "hello"}});
  renamed[34] = 'b';  // the local header's copy of the name
  CHECK(contains(error_of([&] { read_bytes(renamed); }).what(), "local header holds a different name"));

  ZipReader deflated = read_bytes(plain_zip({{"pkg/a", "hello", 8}}));
  const ZipEntry& e = deflated.record("a");
  CHECK(e.method == 8);
  for (auto use : {0, 1, 2}) {
    Error u = error_of([&] {
      if (use == 0) deflated.open(e);
      if (use == 1) deflated.read(e);
      if (use == 2) deflated.verify_crc(e);
    });
    CHECK(u.code() == ErrorCode::kUnimplemented);
    CHECK(contains(u.what(), "test.pt: entry 'pkg/a': compression method 8"));
  }
}

TEST_CASE("zip reader names a missing record and the archive", "[archive]") {
  ZipReader zip = read_bytes(torch_like_archive("ckpt"));
  CHECK(zip.prefix() == "ckpt");
  Error e = error_of([&] { zip.record("data/9"); });
  CHECK(e.code() == ErrorCode::kDataLoss);
  CHECK(std::string(e.what()) == "test.pt: record 'data/9' is missing from archive 'ckpt'");
}

TEST_CASE("zip writer refuses misuse", "[archive]") {
  MemorySink sink;
  ZipWriter zip(sink);
  zip.begin_record("data/0", 4);
  CHECK(error_of([&] { zip.append("12345", 5); }).code() == ErrorCode::kInternal);
  zip.append("12", 2);
  CHECK(error_of([&] { zip.end_record(); }).code() == ErrorCode::kInternal);
  CHECK(error_of([&] { zip.begin_record("data/1", 1); }).code() == ErrorCode::kInternal);
  CHECK(error_of([&] { zip.finish(); }).code() == ErrorCode::kInternal);
  zip.append("34", 2);
  zip.end_record();
  CHECK(error_of([&] { zip.append("x", 1); }).code() == ErrorCode::kInternal);
  CHECK(error_of([&] { zip.write_record("data/0", std::string("x")); }).code() == ErrorCode::kInvalidArgument);
  CHECK(error_of([&] { zip.write_record("../x", std::string("x")); }).code() == ErrorCode::kInvalidArgument);
  CHECK(error_of([&] { zip.write_record("a//b", std::string("x")); }).code() == ErrorCode::kInvalidArgument);
  zip.finish();
  CHECK(error_of([&] { zip.finish(); }).code() == ErrorCode::kInternal);
  CHECK(error_of([&] { zip.write_record("late", std::string("x")); }).code() == ErrorCode::kInternal);
  CHECK(read_bytes(sink.take()).entries().size() == 1);
  CHECK(error_of([&] { ZipWriter bad(sink, "a/b"); }).code() == ErrorCode::kInvalidArgument);
}

TEST_CASE("zip writer destroyed without finish does not throw", "[archive]") {
  MemorySink sink;
  CHECK_NOTHROW([&] {
    ZipWriter zip(sink);
    zip.begin_record("data/0", 100);
    zip.append("x", 1);
  }());
  CHECK_THROWS_AS(read_bytes(sink.take()), Error);  // no directory was written
}
