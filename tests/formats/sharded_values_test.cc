// The ShardedTensor / DTensor values reshard writes, read back by the same
// decoder that reads torch's own per-rank files (testdata/fsdp_st, fsdp_dt):
// each rank's value says the global shape, this rank's torch.chunk box of
// dim 0, its rank and the world size.
#include <catch2/catch.hpp>

#include "formats/torch_pt/pt_reader.h"
#include "formats/torch_pt/pt_writer.h"
#include "formats/torch_pt/sharded_values.h"
#include "io/byte_sink.h"

using namespace ckpt;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// {"w": <value>} written with write_pt (local tensor 0 of `local_shape`,
// the mesh tensor 1 when given).
std::string written(const ValuePtr& value, const Shape& local_shape, bool with_mesh, int world_size) {
  std::vector<torch_pt::OutputTensor> tensors = {{DType::kFloat32, local_shape, false, false}};
  if (with_mesh) tensors.push_back({DType::kInt32, {world_size}, false, false});
  ValuePtr root = Value::dict({{Value::str("w"), value}});
  MemorySink sink;
  torch_pt::write_pt(sink, *root, tensors, [&](std::size_t i, archive::ZipWriter& zip) {
    std::string bytes(shape_numel(tensors[i].shape) * dtype_size(tensors[i].dtype), '\0');
    zip.append(bytes.data(), bytes.size());
  });
  return sink.take();
}

// The same, decoded.
TensorEntry round_trip(const ValuePtr& value, const Shape& local_shape, bool with_mesh, int world_size) {
  std::vector<TensorEntry> decoded;
  torch_pt::decode_archive(make_memory_source(written(value, local_shape, with_mesh, world_size), "rank.pt"), decoded);
  REQUIRE(decoded.size() == 1);
  return decoded[0];
}

}  // namespace

TEST_CASE("a written ShardedTensor decodes to this rank's torch.chunk rows", "[formats][sharded_values]") {
  // 7 rows over 3 ranks: 3, 3, 1.
  TensorEntry t =
      round_trip(torch_pt::make_sharded_tensor(DType::kFloat32, {7, 8}, 2, 3, make_tensor_ref(0)), {1, 8}, false, 3);
  CHECK(t.storage == StorageKind::kShardedTensor);
  CHECK(t.shape == Shape{7, 8});
  CHECK(t.world_size == 3);
  REQUIRE(t.chunks.size() == 1);
  CHECK(t.chunks[0].offsets == Shape{6, 0});
  CHECK(t.chunks[0].sizes == Shape{1, 8});
  CHECK(t.chunks[0].rank == 2);
  CHECK(t.sharding == "ShardedTensor: 3 shards in all");
}

TEST_CASE("a ShardedTensor rank past the last torch.chunk piece has no local shard", "[formats][sharded_values]") {
  // 2 rows over 3 ranks: torch.chunk gives 2 pieces, so 2 shards in all and none on rank 2.
  TensorEntry t =
      round_trip(torch_pt::make_sharded_tensor(DType::kFloat32, {2}, 2, 3, make_tensor_ref(0)), {0}, false, 3);
  CHECK(t.shape == Shape{2});
  CHECK(t.chunks.empty());
  CHECK(t.sharding == "ShardedTensor: 2 shards in all");
}

TEST_CASE("a written DTensor decodes with its mesh size and coordinate", "[formats][sharded_values]") {
  ValuePtr mesh = torch_pt::make_device_mesh(1, 4, make_tensor_ref(1), {});
  TensorEntry t =
      round_trip(torch_pt::make_dtensor(DType::kFloat32, {10, 4}, mesh, make_tensor_ref(0)), {3, 4}, true, 4);
  CHECK(t.storage == StorageKind::kDTensor);
  CHECK(t.shape == Shape{10, 4});
  CHECK(t.world_size == 4);
  REQUIRE(t.chunks.size() == 1);
  CHECK(t.chunks[0].offsets == Shape{3, 0});
  CHECK(t.chunks[0].sizes == Shape{3, 4});
  CHECK(t.chunks[0].rank == 1);
}

TEST_CASE("a DTensor rank past the data holds an empty local tensor at the end", "[formats][sharded_values]") {
  ValuePtr mesh = torch_pt::make_device_mesh(2, 3, make_tensor_ref(1), {});
  TensorEntry t = round_trip(torch_pt::make_dtensor(DType::kFloat32, {2}, mesh, make_tensor_ref(0)), {0}, true, 3);
  REQUIRE(t.chunks.size() == 1);
  CHECK(t.chunks[0].offsets == Shape{2});
  CHECK(t.chunks[0].sizes == Shape{0});
}

TEST_CASE("the mesh's device type and dimension names are found again, and in torch's own files",
          "[formats][sharded_values]") {
  torch_pt::MeshInfo info{"cuda", {"fsdp"}};
  ValuePtr mesh = torch_pt::make_device_mesh(0, 2, make_tensor_ref(1), info);
  std::string bytes = written(torch_pt::make_dtensor(DType::kFloat32, {4}, mesh, make_tensor_ref(0)), {2}, true, 2);
  auto found = torch_pt::find_device_mesh(make_memory_source(bytes, "rank.pt"));
  REQUIRE(found);
  CHECK(found->device_type == "cuda");
  CHECK(found->dim_names == std::vector<std::string>{"fsdp"});

  auto torch_mesh = torch_pt::find_device_mesh(
      open_mapped_source(std::string(CKPT_SOURCE_DIR) + "/testdata/fsdp_dt/adamw_ws2/model_world_size_2_rank_0.pt"));
  REQUIRE(torch_mesh);
  CHECK(torch_mesh->device_type == "cpu");
  CHECK(torch_mesh->dim_names.empty());
  CHECK_FALSE(torch_pt::find_device_mesh(
      open_mapped_source(std::string(CKPT_SOURCE_DIR) + "/testdata/fsdp_st/adamw_ws2/model_rank0.pt")));
}
