#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check/file_streams.h"
#include "exec/checksum.h"
#include "io/byte_source.h"

using namespace ckpt;
using namespace ckpt::check;

namespace {

struct Sample {
  std::string dir, path;
  std::string bytes;
  SourcePtr file;
  explicit Sample(std::size_t n) {
    char tmpl[] = "/tmp/ckpt-streams-XXXXXX";
    dir = ::mkdtemp(tmpl);
    path = dir + "/f.bin";
    std::mt19937 rng(7);
    bytes.resize(n);
    for (auto& c : bytes) c = static_cast<char>(rng());
    std::FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    file = open_file_source(path);
  }
  ~Sample() {
    file.reset();
    std::filesystem::remove_all(dir);
  }
  // Where byte `off` lies, as a scan reading the file sees it.
  FileSpan span(std::size_t off) const { return *file->file_span(off); }
  std::string want() const {
    Hasher h(ChecksumAlgorithm::kXxh3_64);
    h.update(bytes.data(), bytes.size());
    return h.hex_digest();
  }
  const std::byte* at(std::size_t off) const { return reinterpret_cast<const std::byte*>(bytes.data()) + off; }
};

std::string finished(FileStreams& streams) {
  ProblemSink problems;
  streams.finish(problems);
  REQUIRE(problems.problems().empty());
  return streams.checksum(0);
}

// Slices of `size` bytes over the whole file, in order.
std::vector<std::pair<std::size_t, std::size_t>> slices(std::size_t total, std::size_t size) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t off = 0; off < total; off += size) out.emplace_back(off, std::min(size, total - off));
  return out;
}

}  // namespace

TEST_CASE("file streams give the file's checksum whatever the scan feeds, in whatever order", "[check]") {
  Sample s(3'000'017);
  CheckpointModel empty;
  SECTION("nothing fed: finish reads it all") {
    FileStreams streams({s.path}, ChecksumAlgorithm::kXxh3_64, empty, 1 << 20);
    CHECK(finished(streams) == s.want());
    CHECK(streams.size(0) == s.bytes.size());
  }
  SECTION("fed in order, with gaps the stream reads itself") {
    FileStreams streams({s.path}, ChecksumAlgorithm::kXxh3_64, empty, 1 << 20);
    for (auto [off, n] : slices(s.bytes.size(), 100'000))
      if ((off / 100'000) % 3 != 1) streams.feed(s.span(off), s.at(off), n);
    CHECK(finished(streams) == s.want());
  }
  for (uint64_t budget : {uint64_t{0}, uint64_t{200'000}, uint64_t{64} << 20}) {
    SECTION("fed shuffled, overlapping, with a budget of " + std::to_string(budget)) {
      FileStreams streams({s.path}, ChecksumAlgorithm::kXxh3_64, empty, budget);
      auto parts = slices(s.bytes.size(), 70'001);
      auto more = slices(s.bytes.size(), 123'457);  // the same bytes again, cut elsewhere
      parts.insert(parts.end(), more.begin(), more.end());
      std::shuffle(parts.begin(), parts.end(), std::mt19937(11));
      for (auto [off, n] : parts) streams.feed(s.span(off), s.at(off), n);
      CHECK(finished(streams) == s.want());
    }
  }
  SECTION("two workers announcing their ranges, the later one waiting for the earlier") {
    FileStreams streams({s.path}, ChecksumAlgorithm::kXxh3_64, empty, 0);
    std::size_t half = s.bytes.size() / 2;
    auto worker = [&](std::size_t begin, std::size_t end) {
      FileStreams::Reading reading(streams, s.span(begin), end - begin);
      for (std::size_t off = begin; off < end; off += 65'536)
        streams.feed(s.span(off), s.at(off), std::min<std::size_t>(65'536, end - off));
    };
    std::thread late(worker, half, s.bytes.size());
    std::thread early(worker, 0, half);
    early.join();
    late.join();
    CHECK(finished(streams) == s.want());
  }
}

TEST_CASE("a file that cannot be read is a problem naming it, not a checksum", "[check]") {
  CheckpointModel empty;
  FileStreams streams({"/nonexistent/ckpt/__0_0.distcp"}, ChecksumAlgorithm::kXxh3_64, empty, 0);
  ProblemSink problems;
  streams.finish(problems);
  REQUIRE(problems.problems().size() == 1);
  CHECK(problems.problems()[0].file == "/nonexistent/ckpt/__0_0.distcp");
  CHECK(streams.checksum(0).empty());
}
