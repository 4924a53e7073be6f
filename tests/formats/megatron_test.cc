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

TEST_CASE("a model's experts stack back on (layers, experts) as megatron-core stored them", "[formats][megatron]") {
  // The --only model view of a real EP=2 job (every expert at its global
  // index, under the module's names) written back: megatron-core's own keys,
  // shapes and sharded objects.
  CheckpointModel read = megatron::read_torch_dist(testdata("megatron/moe_ep2/ckpt"), nullptr, "model");
  CheckpointModel model = read;
  model.root = mapping_of(read.root)->get("model");
  REQUIRE(model.root);
  megatron::TorchDistOutput out = megatron::torch_dist_from_model(model);
  megatron::TorchDistOutput want =
      megatron::torch_dist_output(megatron::read_torch_dist(testdata("megatron/moe_ep2/ckpt"), nullptr, ""));
  std::size_t model_keys = 0;
  for (const auto& [k, v] : mapping_of(want.items.root)->entries) {
    const std::string key = path_component(*k);
    if (key.find("optimizer.") != std::string::npos) continue;  // the job's optimizer, not the model
    ++model_keys;
    pickle::ValuePtr ours = mapping_of(out.items.root)->get(key);
    INFO(key);
    REQUIRE(ours);
    if (auto idx = tensor_ref_index(*v))
      CHECK(tensor_at(out.items, out.items.root, key).shape == want.items.tensors.at(*idx).shape);
  }
  CHECK(mapping_of(out.items.root)->entries.size() == model_keys);
  const TensorEntry& fc2 = tensor_at(out.items, out.items.root, "decoder.layers.mlp.experts.experts.linear_fc2.weight");
  CHECK(fc2.shape == Shape{2, 4, 8, 12});
  // Expert 3 of layer 1 is the chunks at (1, 3).
  for (const auto& c : fc2.chunks)
    if (c.offsets[0] == 1 && c.offsets[1] == 3) CHECK(c.sizes == Shape{1, 1, 8, 12});

  // An expert missing leaves a hole no stack may have.
  auto& entries = mapping_of(model.root)->entries;
  entries.erase(std::remove_if(entries.begin(), entries.end(),
                               [](const auto& e) {
                                 return path_component(*e.first) ==
                                        "decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight";
                               }),
                entries.end());
  CHECK_THROWS_WITH(
      megatron::torch_dist_from_model(model),
      Catch::Contains("decoder.layers.mlp.experts.experts.linear_fc2.weight") && Catch::Contains("one missing"));
}
