// The Megatron torch_dist reader's views and writer's items
// (formats/megatron), on the jobs real megatron-core 0.16.1 saved
// (testdata/megatron): where an unstacked layer's bytes come from, the
// experts' names, and how sharded objects are stored back.
#include <catch2/catch.hpp>

#include "formats/megatron/megatron_reader.h"
#include "formats/megatron/megatron_writer.h"
#include "model/tree_walk.h"

using namespace ckpt;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

const TensorEntry& tensor_at(const CheckpointModel& m, const pickle::ValuePtr& dict, const std::string& key) {
  pickle::ValuePtr v = mapping_of(dict)->get(key);
  REQUIRE(v);
  auto idx = tensor_ref_index(*v);
  REQUIRE(idx);
  return m.tensors.at(*idx);
}

}  // namespace

TEST_CASE("a layer of a stacked, TP-split tensor keeps its chunks, narrowed", "[formats][megatron]") {
  // TP=2 x PP=2: linear_fc1.weight is [2 layers, 24, 8], stored as each TP
  // rank's gate and up halves: 4 chunks of 6 rows per layer.
  CheckpointModel m = megatron::read_torch_dist(testdata("megatron/gpt_tp2pp2/ckpt"), nullptr, "model");
  pickle::ValuePtr model = mapping_of(m.root)->get("model");
  REQUIRE(model);
  const TensorEntry& fc1 = tensor_at(m, model, "decoder.layers.1.mlp.linear_fc1.weight");
  CHECK(fc1.shape == Shape{24, 8});
  REQUIRE(fc1.chunks.size() == 4);
  std::vector<int64_t> rows;
  for (const auto& c : fc1.chunks) {
    CHECK(c.sizes == Shape{6, 8});
    CHECK(c.rank >= 2);  // layer 1 lives on the second pipeline stage (ranks 2 and 3)
    rows.push_back(c.offsets[0]);
  }
  std::sort(rows.begin(), rows.end());
  CHECK(rows == std::vector<int64_t>{0, 6, 12, 18});
  // A parameter outside the stack keeps its name and chunks.
  CHECK(tensor_at(m, model, "output_layer.weight").shape == Shape{16, 8});
  CHECK(m.info.kind == SourceKind::kMegatron);
  CHECK(!m.info.megatron);  // only the stored view records its objects and common state
}

TEST_CASE("MoE experts unstack by layer, then by expert, under the module's names", "[formats][megatron]") {
  CheckpointModel m = megatron::read_torch_dist(testdata("megatron/moe_ep2/ckpt"), nullptr, "optim");
  pickle::ValuePtr model = mapping_of(m.root)->get("model");
  CHECK(tensor_at(m, model, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight").shape == Shape{8, 12});
  CHECK(!mapping_of(model)->get("decoder.layers.1.mlp.experts.experts.linear_fc2.weight"));
  // The expert optimizer (chained_1) under the same names as the model.
  pickle::ValuePtr state = mapping_of(mapping_of(m.root)->get("optim"))->get("state");
  REQUIRE(state);
  pickle::ValuePtr expert = mapping_of(state)->get("decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight");
  REQUIRE(expert);
  CHECK(tensor_at(m, expert, "exp_avg").shape == Shape{24, 8});
}

TEST_CASE("the stored view goes back to megatron-core's items", "[formats][megatron]") {
  CheckpointModel stored = megatron::read_torch_dist(testdata("megatron/gpt_tp2pp2/ckpt"), nullptr, "");
  REQUIRE(stored.info.megatron);
  CHECK(stored.info.megatron->common_keys == std::vector<std::string>{"iteration", "optimizer"});
  megatron::TorchDistOutput out = megatron::torch_dist_output(stored);
  pickle::ValuePtr root = mapping_of(out.items.root);
  // Objects are shards again, each [value]; common state is left to common.pt.
  pickle::ValuePtr shard = root->get("decoder.layers.self_attention.linear_proj._extra_state/shard_1_2");
  REQUIRE(shard);
  REQUIRE(shard->is(pickle::Kind::kList));
  CHECK(shard->items.size() == 1);
  CHECK(!root->get("decoder.layers.self_attention.linear_proj._extra_state"));
  CHECK(!root->get("iteration"));
  CHECK(out.side_files.size() == 2);
  CHECK(out.items.tensors.size() == stored.tensors.size());
  // A view cut by --only is no torch_dist checkpoint to write.
  CheckpointModel model = megatron::read_torch_dist(testdata("megatron/gpt_tp2pp2/ckpt"), nullptr, "model");
  CHECK_THROWS(megatron::torch_dist_output(model));
}
