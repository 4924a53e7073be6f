#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "archive/zip_reader.h"
#include "archive/zip_writer.h"
#include "exec/tensor_copy.h"
#include "io/byte_sink.h"

using namespace ckpt;

namespace {
std::string floats(std::vector<float> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

// Writes one record with the tensor and returns its bytes.
std::string assemble(const TensorEntry& t, CopyOptions options = {}) {
  MemorySink sink;
  archive::ZipWriter zip(sink);
  zip.begin_record("t", t.output_nbytes());
  append_tensor(t, zip, options);
  zip.end_record();
  zip.finish();
  archive::ZipReader reader(make_memory_source(sink.take()));
  return reader.read(reader.entries().at(0));
}
}  // namespace

TEST_CASE("copy_box gathers a transposed view", "[exec]") {
  float src[6] = {0, 1, 2, 3, 4, 5};  // 2x3 row-major, viewed as its 3x2 transpose
  float dst[6] = {};
  copy_box(reinterpret_cast<const std::byte*>(src), {1, 3}, reinterpret_cast<std::byte*>(dst), {2, 1}, {3, 2}, 4);
  CHECK(std::vector<float>(dst, dst + 6) == std::vector<float>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("row shards are concatenated in offset order", "[exec]") {
  TensorEntry t;
  t.name = "w";
  t.shape = {3, 2};
  TensorChunk second{{2, 0}, {1, 2}, make_memory_source(floats({5, 6})), 0, {2, 1}, std::nullopt, "b", 1, ""};
  TensorChunk first{{0, 0}, {2, 2}, make_memory_source(floats({1, 2, 3, 4})), 0, {2, 1}, std::nullopt, "a", 0, ""};
  t.chunks = {second, first};
  CHECK(assemble(t) == floats({1, 2, 3, 4, 5, 6}));
}

TEST_CASE("column shards and small slabs assemble through the gather path", "[exec]") {
  TensorEntry t;
  t.name = "w";
  t.shape = {2, 3};
  TensorChunk left{{0, 0}, {2, 2}, make_memory_source(floats({1, 2, 4, 5})), 0, {2, 1}, std::nullopt, "a", 0, ""};
  TensorChunk right{{0, 2}, {2, 1}, make_memory_source(floats({3, 6})), 0, {1, 1}, std::nullopt, "b", 1, ""};
  t.chunks = {left, right};
  CopyOptions tiny;
  tiny.memory_limit = 1;  // one row per slab
  CHECK(assemble(t, tiny) == floats({1, 2, 3, 4, 5, 6}));
}

TEST_CASE("column shards read through pread sources gather only their boxes", "[exec]") {
  // 600 rows x 3 columns: columns 0-1 row-major in one file, column 2 in
  // another at storage offset 2; files read with pread, not mapped.
  const int64_t rows = 600;
  std::vector<float> left, right, want;
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < 3; ++c) want.push_back(static_cast<float>(r * 3 + c));
    left.push_back(static_cast<float>(r * 3));
    left.push_back(static_cast<float>(r * 3 + 1));
  }
  for (int64_t r = 0; r < rows; ++r) right.push_back(static_cast<float>(r * 3 + 2));
  char dir_template[] = "/tmp/ckpt-tensor-copy-XXXXXX";
  std::string dir = ::mkdtemp(dir_template);
  auto write_file = [&](const std::string& name, const std::string& bytes) {
    std::string path = dir + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return open_file_source(path);
  };
  // Pad the right file so that the box starts at a non-zero storage offset.
  SourcePtr left_src = write_file("left", floats(left));
  SourcePtr right_src = write_file("right", floats({-1, -1}) + floats(right));
  REQUIRE(left_src->data() == nullptr);
  TensorEntry t;
  t.name = "w";
  t.shape = {rows, 3};
  t.chunks = {TensorChunk{{0, 0}, {rows, 2}, left_src, 0, {2, 1}, std::nullopt, "left", 0, ""},
              TensorChunk{{0, 2}, {rows, 1}, right_src, 2, {1, 1}, std::nullopt, "right", 1, ""}};
  CopyOptions small;
  small.memory_limit = 1000;  // many slabs
  CHECK(assemble(t, small) == floats(want));
  std::vector<float> rows_10_to_20(30);
  assemble_rows(t, 10, 20, reinterpret_cast<std::byte*>(rows_10_to_20.data()));
  CHECK(std::vector<float>(rows_10_to_20) == std::vector<float>(want.begin() + 30, want.begin() + 60));
  std::remove((dir + "/left").c_str());
  std::remove((dir + "/right").c_str());
  ::rmdir(dir.c_str());
}
