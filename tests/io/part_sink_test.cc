// PartSink: each of several sinks over one file writes only its ranges, so
// that together they write the whole of what one sequential writer would.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/byte_source.h"
#include "io/part_sink.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// What a writer produces: text, then source bytes, then text.
void write_stream(ByteSink& sink, const ByteSource& src) {
  sink.write("header:");
  sink.copy_from(src, 2, 10);
  sink.write(":trailer");
}

}  // namespace

TEST_CASE("PartSinks over one file, each with its ranges, write what one stream writes", "[io]") {
  fs::path dir = fs::temp_directory_path() / ("ckpt_part_sink_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path src_path = dir / "src", out = dir / "out";
  std::ofstream(src_path, std::ios::binary) << "0123456789abcdefghij";
  SourcePtr src = open_file_source(src_path.string());
  const std::string want = "header:23456789ab:trailer";  // 25 bytes

  PartSink counter(-1, {}, "count");  // no file: only counts
  write_stream(counter, *src);
  REQUIRE(counter.position() == want.size());

  int fd = ::open(out.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  // Three owners: ranges cutting through the text and the copied bytes.
  for (const PartSink::Ranges& ranges :
       {PartSink::Ranges{{0, 3}, {12, 14}}, PartSink::Ranges{{3, 12}}, PartSink::Ranges{{14, 20}, {20, 25}}}) {
    PartSink sink(fd, ranges, "out");
    write_stream(sink, *src);
    CHECK(sink.position() == want.size());
  }
  ::close(fd);
  CHECK(read_all(out) == want);

  // A sink that owns nothing writes nothing, and skip() only moves.
  fd = ::open(out.c_str(), O_RDWR | O_TRUNC, 0644);
  PartSink none(fd, {}, "out");
  write_stream(none, *src);
  none.skip(5);
  CHECK(none.position() == want.size() + 5);
  ::close(fd);
  CHECK(read_all(out).empty());
  fs::remove_all(dir);
}

TEST_CASE("streamed PartSinks write every byte of ranges larger than the writeback windows", "[io]") {
  // Two owners of one file, alternating ranges that align with no window,
  // each 20-50 MiB, written through copies and writes: past the windows in
  // flight (io/writeback.h), so earlier ranges are waited for and dropped.
  fs::path dir = fs::temp_directory_path() / ("ckpt_part_stream_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string payload((150u << 20) + 777, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 % 251);
  std::ofstream(dir / "src", std::ios::binary) << payload;
  SourcePtr src = open_file_source((dir / "src").string());
  const uint64_t cuts[] = {0, 21u << 20, (71u << 20) + 3, (93u << 20) + 5, (150u << 20) + 777};
  PartSink::Ranges mine[2];
  for (int r = 0; r < 4; ++r) mine[r % 2].push_back({cuts[r], cuts[r + 1]});
  int fd = ::open((dir / "out").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  for (const auto& ranges : mine) {
    PartSink sink(fd, ranges, "out", 0, /*stream=*/true);
    sink.copy_from(*src, 0, 90u << 20);
    sink.write(payload.data() + (90u << 20), payload.size() - (90u << 20));
  }
  ::close(fd);
  CHECK(read_all(dir / "out") == payload);
  fs::remove_all(dir);
}
