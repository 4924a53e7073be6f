#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/byte_sink.h"
#include "io/byte_source.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("ckpt_io_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}
std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("sub source reads relative to its slice and refuses to leave it", "[io]") {
  auto mem = make_memory_source("0123456789", "mem");
  auto sub = make_sub_source(mem, 3, 4);
  CHECK(sub->size() == 4);
  CHECK(sub->read_string(1, 2) == "45");
  CHECK_THROWS_AS(sub->read_string(3, 2), Error);
  CHECK_THROWS_AS(make_sub_source(mem, 8, 3), Error);
  CHECK(sub->describe() == "mem[3:+4]");
}

TEST_CASE("file sources name the missing file", "[io]") {
  try {
    open_file_source("/nonexistent/ckpt.pt");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kNotFound);
    CHECK(std::string(e.what()).find("/nonexistent/ckpt.pt") != std::string::npos);
  }
}

TEST_CASE("mapped and pread sources agree", "[io]") {
  auto dir = fresh_dir("src");
  std::ofstream(dir / "f.bin", std::ios::binary) << "hello world";
  auto a = open_file_source((dir / "f.bin").string());
  auto b = open_mapped_source((dir / "f.bin").string());
  CHECK(a->read_string(6, 5) == "world");
  CHECK(b->read_string(6, 5) == "world");
  REQUIRE(b->data() != nullptr);
  CHECK_THROWS_AS(a->read_string(6, 6), Error);
  fs::remove_all(dir);
}

TEST_CASE("atomic sink appears only after finish", "[io]") {
  auto dir = fresh_dir("sink");
  auto dest = (dir / "out.bin").string();
  {
    auto sink = AtomicFileSink::create(dest, false);
    sink->write(std::string("abc"));
    CHECK_FALSE(fs::exists(dest));
    CHECK(fs::exists(sink->temp_path()));
    // destroyed without finish
  }
  CHECK_FALSE(fs::exists(dest));
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 0);

  auto sink = AtomicFileSink::create(dest, false);
  sink->write(std::string("abc"));
  sink->finish();
  CHECK(slurp(dest) == "abc");
  CHECK_THROWS_AS(AtomicFileSink::create(dest, false), Error);
  fs::remove_all(dir);
}

TEST_CASE("a durable sink streams its output out as it grows and still writes every byte", "[io]") {
  // Past the writeback windows (32 MiB, two in flight): writes, copies and
  // small pieces interleaved at offsets that align with no window.
  auto dir = fresh_dir("stream");
  std::string payload((40u << 20) + 12345, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 % 251);
  std::ofstream(dir / "in.bin", std::ios::binary) << payload;
  auto src = open_file_source((dir / "in.bin").string());
  for (bool durable : {true, false}) {
    auto sink = AtomicFileSink::create((dir / "out.bin").string(), true, durable);
    std::string expect;
    sink->write(std::string("HDR"));
    expect += "HDR";
    sink->copy_from(*src, 7, payload.size() - 7);
    expect += payload.substr(7);
    sink->write(payload.data(), 3u << 20);  // a large write, past the coalescing buffer
    expect += payload.substr(0, 3u << 20);
    for (int i = 0; i < 80; ++i) {  // and many small ones through it (123 MiB in all)
      sink->write(payload.data() + i * 997, 1u << 20);
      expect += payload.substr(static_cast<std::size_t>(i) * 997, 1u << 20);
    }
    sink->copy_from(*src, 5, 1000);
    expect += payload.substr(5, 1000);
    CHECK(sink->position() == expect.size());
    sink->finish();
    CHECK(slurp(dir / "out.bin") == expect);
  }
  fs::remove_all(dir);
}

TEST_CASE("copy_from moves large file ranges exactly", "[io]") {
  auto dir = fresh_dir("copy");
  std::string payload(5u << 20, '\0');
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 131 % 251);
  std::ofstream(dir / "in.bin", std::ios::binary) << payload;
  auto src = open_file_source((dir / "in.bin").string());
  auto sink = AtomicFileSink::create((dir / "out.bin").string(), false);
  sink->write(std::string("HDR"));
  sink->copy_from(*src, 17, payload.size() - 17);
  sink->write(std::string("T"));
  CHECK(sink->position() == 3 + payload.size() - 17 + 1);
  sink->finish();
  CHECK(slurp(dir / "out.bin") == "HDR" + payload.substr(17) + "T");
  fs::remove_all(dir);
}
