#include <catch2/catch.hpp>

#include "core/error.h"
#include "model/validate.h"

using namespace ckpt;

namespace {
// The messages of every problem of one tensor.
std::vector<std::string> tensor_problems(const TensorEntry& t) {
  std::vector<std::string> out;
  visit_tensor_problems(t, [&](Problem p, bool) { out.push_back(p.message); });
  return out;
}
}  // namespace

namespace {
// A float32 tensor of `shape` split into row ranges, each with its own storage.
TensorEntry row_sharded(Shape shape, std::vector<std::pair<int64_t, int64_t>> rows) {
  TensorEntry t;
  t.name = std::string("w");  // not = "w": GCC 12's -Wrestrict false positive on assigning a literal
  t.shape = shape;
  Shape row(shape.begin() + 1, shape.end());
  for (auto [start, count] : rows) {
    TensorChunk c;
    c.offsets.assign(shape.size(), 0);
    c.offsets[0] = start;
    c.sizes = shape;
    c.sizes[0] = count;
    c.strides = contiguous_strides(c.sizes);
    c.storage = make_memory_source(std::string(static_cast<std::size_t>(shape_numel(c.sizes) * 4), '\0'), "mem");
    c.file = "__" + std::to_string(t.chunks.size()) + "_0.distcp";
    c.rank = static_cast<int>(t.chunks.size());
    t.chunks.push_back(c);
  }
  return t;
}
}  // namespace

TEST_CASE("chunks that tile the tensor exactly are valid, empty trailing chunks included", "[model]") {
  auto t = row_sharded({7, 8}, {{0, 2}, {2, 2}, {4, 2}, {6, 1}, {7, 0}});
  CHECK(tensor_problems(t).empty());
}

TEST_CASE("a gap in coverage is reported with the covered count", "[model]") {
  auto t = row_sharded({7, 8}, {{0, 2}, {4, 3}});
  auto p = tensor_problems(t);
  REQUIRE(p.size() == 1);
  CHECK(p[0] == "tensor 'w' of shape (7, 8) has chunks covering 40 of its 56 elements (a gap)");
}

TEST_CASE("overlapping chunks name both chunks, files and ranks", "[model]") {
  auto t = row_sharded({7, 8}, {{0, 4}, {3, 4}});
  auto p = tensor_problems(t);
  REQUIRE(p.size() == 1);
  CHECK(p[0] ==
        "tensor 'w' chunk 0 (offsets (0, 0), sizes (4, 8), file __0_0.distcp, rank 0) overlaps "
        "tensor 'w' chunk 1 (offsets (3, 0), sizes (4, 8), file __1_0.distcp, rank 1)");
}

TEST_CASE("a chunk outside the tensor or its storage is reported", "[model]") {
  auto t = row_sharded({4, 2}, {{0, 2}, {2, 3}});
  CHECK(tensor_problems(t).at(0).find("lies outside the tensor's shape (4, 2)") != std::string::npos);
  auto u = row_sharded({4, 2}, {{0, 4}});
  u.chunks[0].storage = make_memory_source(std::string(31, '\0'), "short");
  CHECK(tensor_problems(u).at(0).find("needs 32 storage bytes, short has 31") != std::string::npos);
}

TEST_CASE("require_valid throws DataLoss naming the source", "[model]") {
  CheckpointModel m;
  m.source = "ckpt/";
  m.tensors.push_back(row_sharded({3}, {{0, 1}}));
  try {
    require_valid(m);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(std::string(e.what()).rfind("ckpt/: checkpoint is inconsistent: tensor 'w'", 0) == 0);
  }
}
