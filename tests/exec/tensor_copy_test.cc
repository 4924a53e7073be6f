#include <catch2/catch.hpp>

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
  TensorChunk second{{2, 0}, {1, 2}, make_memory_source(floats({5, 6})), 0, {2, 1}, std::nullopt, "b", 1};
  TensorChunk first{{0, 0}, {2, 2}, make_memory_source(floats({1, 2, 3, 4})), 0, {2, 1}, std::nullopt, "a", 0};
  t.chunks = {second, first};
  CHECK(assemble(t) == floats({1, 2, 3, 4, 5, 6}));
}

TEST_CASE("column shards and small slabs assemble through the gather path", "[exec]") {
  TensorEntry t;
  t.name = "w";
  t.shape = {2, 3};
  TensorChunk left{{0, 0}, {2, 2}, make_memory_source(floats({1, 2, 4, 5})), 0, {2, 1}, std::nullopt, "a", 0};
  TensorChunk right{{0, 2}, {2, 1}, make_memory_source(floats({3, 6})), 0, {1, 1}, std::nullopt, "b", 1};
  t.chunks = {left, right};
  CopyOptions tiny;
  tiny.memory_limit = 1;  // one row per slab
  CHECK(assemble(t, tiny) == floats({1, 2, 3, 4, 5, 6}));
}
