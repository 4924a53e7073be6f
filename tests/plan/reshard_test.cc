#include <catch2/catch.hpp>

#include "core/error.h"
#include "plan/reshard.h"

using namespace ckpt;

namespace {
// A tensor of `shape` split on dim 0 at `cuts` (one chunk per rank, empty ones included).
TensorEntry sharded(const std::string& name, Shape shape, const std::vector<int64_t>& row_starts) {
  TensorEntry t;
  t.name = name;
  t.shape = shape;
  for (std::size_t r = 0; r < row_starts.size(); ++r) {
    TensorChunk c;
    c.offsets.assign(shape.size(), 0);
    c.offsets[0] = row_starts[r];
    c.sizes = shape;
    int64_t end = r + 1 < row_starts.size() ? row_starts[r + 1] : shape[0];
    c.sizes[0] = end - row_starts[r];
    c.strides = contiguous_strides(c.sizes);
    c.rank = static_cast<int>(r);
    t.chunks.push_back(c);
  }
  return t;
}

TensorEntry scalar(const std::string& name) {
  TensorEntry t;
  t.name = name;
  TensorChunk c;
  c.rank = 0;
  t.chunks.push_back(c);
  return t;
}
}  // namespace

TEST_CASE("fsdp2 box follows torch.chunk on dim 0 with empty trailing ranks", "[plan][reshard]") {
  Shape off, size;
  fsdp2_box({7, 8}, 3, 0, off, size);
  CHECK(off == Shape{0, 0});
  CHECK(size == Shape{3, 8});
  fsdp2_box({7, 8}, 3, 2, off, size);
  CHECK(off == Shape{6, 0});
  CHECK(size == Shape{1, 8});
  fsdp2_box({2}, 8, 1, off, size);
  CHECK(off == Shape{1});
  CHECK(size == Shape{1});
  fsdp2_box({2}, 8, 5, off, size);
  CHECK(off == Shape{2});
  CHECK(size == Shape{0});
  fsdp2_box({4, 4}, 3, 2, off, size);  // ceil(4/3) = 2: ranks 0, 1 full, rank 2 empty
  CHECK(off == Shape{4, 0});
  CHECK(size == Shape{0, 4});
}

TEST_CASE("reshard 2 -> 3 maps each output rank to the overlapping source chunks", "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {sharded("model.fc2.weight", {7, 8}, {0, 4})};
  ReshardPlan plan = plan_reshard(tensors, 3, 2);
  REQUIRE(plan.ranks.size() == 3);
  CHECK_FALSE(plan.replicated[0]);
  // rank 0: rows [0,3) from chunk 0; rank 1: rows [3,6) = [3,4) of chunk 0 + [4,6) of chunk 1; rank 2: row 6.
  REQUIRE(plan.ranks[0].size() == 1);
  REQUIRE(plan.ranks[0][0].pieces.size() == 1);
  CHECK(plan.ranks[0][0].pieces[0].chunk == 0);
  CHECK(plan.ranks[0][0].pieces[0].sizes == Shape{3, 8});
  const OutputItem& mid = plan.ranks[1][0];
  CHECK(mid.offsets == Shape{3, 0});
  CHECK(mid.sizes == Shape{3, 8});
  REQUIRE(mid.pieces.size() == 2);
  CHECK(mid.pieces[0].chunk == 0);
  CHECK(mid.pieces[0].offsets == Shape{3, 0});
  CHECK(mid.pieces[0].sizes == Shape{1, 8});
  CHECK(mid.pieces[1].chunk == 1);
  CHECK(mid.pieces[1].offsets == Shape{4, 0});
  CHECK(mid.pieces[1].sizes == Shape{2, 8});
  REQUIRE(plan.ranks[2][0].pieces.size() == 1);
  CHECK(plan.ranks[2][0].pieces[0].offsets == Shape{6, 0});
  CHECK(plan.ranks[2][0].pieces[0].sizes == Shape{1, 8});
}

TEST_CASE("empty trailing chunks are planned once, on the first empty rank", "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {sharded("model.scale", {2}, {0, 1})};
  ReshardPlan plan = plan_reshard(tensors, 8, 2);
  REQUIRE(plan.items_of_tensor[0].size() == 3);
  CHECK(plan.items_of_tensor[0][2].first == 2);
  const OutputItem& empty = plan.ranks[2][0];
  CHECK(empty.offsets == Shape{2});
  CHECK(empty.sizes == Shape{0});
  CHECK(empty.pieces.empty());
  for (int r = 3; r < 8; ++r) CHECK(plan.ranks[static_cast<std::size_t>(r)].empty());
}

TEST_CASE("0-dim tensors and whole tensors of a multi-rank source stay replicated on rank 0", "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {scalar("optim.state.w.step"), sharded("model.buf", {6}, {0})};
  ReshardPlan plan = plan_reshard(tensors, 4, 2);
  CHECK(plan.replicated[0]);
  CHECK(plan.replicated[1]);
  REQUIRE(plan.ranks[0].size() == 2);
  CHECK(plan.ranks[0][1].sizes == Shape{6});
  REQUIRE(plan.ranks[0][0].pieces.size() == 1);
  CHECK(plan.ranks[0][0].pieces[0].offsets.empty());
  for (int r = 1; r < 4; ++r) CHECK(plan.ranks[static_cast<std::size_t>(r)].empty());
}

TEST_CASE("a single-rank source's tensors with dimensions are sharded", "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {sharded("model.w", {5, 2}, {0})};
  ReshardPlan plan = plan_reshard(tensors, 2, 1);
  CHECK_FALSE(plan.replicated[0]);
  CHECK(plan.ranks[0][0].sizes == Shape{3, 2});
  CHECK(plan.ranks[1][0].offsets == Shape{3, 0});
  CHECK(plan.ranks[1][0].sizes == Shape{2, 2});
}

TEST_CASE("world size below 1 is an invalid argument", "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {scalar("s")};
  try {
    plan_reshard(tensors, 0, 1);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(e.message() == "--world-size must be at least 1 (got 0)");
  }
}

TEST_CASE("source world size counts the distinct ranks of the chunks", "[plan][reshard]") {
  CheckpointModel m;
  m.tensors = {sharded("a", {4}, {0, 2, 3}), scalar("s")};
  CHECK(source_world_size(m) == 3);
}

TEST_CASE("per-rank files: sharded tensors get every rank's torch.chunk box, plain ones go whole to every rank",
          "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {sharded("optim.state.scale.exp_avg", {2}, {0, 1}),
                                      scalar("optim.state.scale.step")};
  ReshardPlan plan = plan_rank_files(tensors, {true, false}, 3);
  REQUIRE(plan.ranks.size() == 3);
  CHECK_FALSE(plan.replicated[0]);
  CHECK(plan.replicated[1]);
  for (int r = 0; r < 3; ++r) {
    const auto& items = plan.ranks[r];
    REQUIRE(items.size() == 2);
    CHECK(plan.items_of_tensor[0][r] == std::make_pair(r, std::size_t{0}));
    CHECK(items[1].tensor == 1);
    CHECK(items[1].sizes.empty());
    REQUIRE(items[1].pieces.size() == 1);
  }
  // 2 rows over 3 ranks: [0:1] from source rank 0, [1:2] from source rank 1, rank 2 empty at offset 2.
  CHECK(plan.ranks[0][0].offsets == Shape{0});
  CHECK(plan.ranks[1][0].pieces.at(0).chunk == 1);
  CHECK(plan.ranks[2][0].offsets == Shape{2});
  CHECK(plan.ranks[2][0].sizes == Shape{0});
  CHECK(plan.ranks[2][0].pieces.empty());
}

TEST_CASE("per-rank files at world size 1 hold every tensor whole (FSDP1 NO_SHARD)", "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {sharded("model.fc2.weight", {7, 8}, {0, 4})};
  ReshardPlan plan = plan_rank_files(tensors, {true}, 1);
  CHECK(plan.replicated[0]);
  REQUIRE(plan.ranks[0].size() == 1);
  CHECK(plan.ranks[0][0].sizes == Shape{7, 8});
  CHECK(plan.ranks[0][0].pieces.size() == 2);
  CHECK_THROWS_AS(plan_rank_files(tensors, {true}, 0), Error);
}

TEST_CASE("an item's tensor views its source pieces from the item's origin", "[plan][reshard]") {
  std::vector<TensorEntry> tensors = {sharded("model.fc2.weight", {7, 8}, {0, 4})};
  ReshardPlan plan = plan_reshard(tensors, 3, 2);
  const OutputItem& item = plan.ranks[1][0];  // rows [3:6): row 3 of source rank 0, rows 4-5 of source rank 1
  TensorEntry local = item_tensor(tensors[0], item);
  CHECK(local.shape == Shape{3, 8});
  REQUIRE(local.chunks.size() == 2);
  CHECK(local.chunks[0].offsets == Shape{0, 0});
  CHECK(local.chunks[0].sizes == Shape{1, 8});
  CHECK(local.chunks[0].storage_offset == 3 * 8);
  CHECK(local.chunks[1].offsets == Shape{1, 0});
  CHECK(local.chunks[1].sizes == Shape{2, 8});
  CHECK(local.chunks[1].storage_offset == 0);
}
