// Megatron-LM legacy checkpoints (formats/megatron_legacy): the TP layout
// rules, rank folder names, and where the merged model's bytes come from in
// the TP=2 x PP=2 job Megatron-LM's own save_checkpoint wrote
// (testdata/megatron_legacy).
#include <catch2/catch.hpp>

#include "core/error.h"
#include "formats/megatron_legacy/legacy_reader.h"
#include "formats/megatron_legacy/tp_layout.h"
#include "model/tree_walk.h"

using namespace ckpt;
using namespace ckpt::megatron_legacy;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

const TensorEntry& tensor_at(const CheckpointModel& m, const std::string& key) {
  pickle::ValuePtr v = mapping_of(m.root->get("model"))->get(key);
  REQUIRE(v);
  auto idx = tensor_ref_index(*v);
  REQUIRE(idx);
  return m.tensors.at(*idx);
}

}  // namespace

TEST_CASE("TP split rules follow megatron-core's layer kinds", "[formats][megatron_legacy]") {
  CHECK(tp_split_of("embedding.word_embeddings.weight", true) == TpSplit::kDim0);
  CHECK(tp_split_of("embedding.position_embeddings.weight", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_qkv.weight", true) == TpSplit::kDim0);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_qkv.bias", true) == TpSplit::kDim0);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_proj.weight", true) == TpSplit::kDim1);
  CHECK(tp_split_of("decoder.layers.0.self_attention.linear_proj.bias", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc1.weight", true) == TpSplit::kGatedDim0);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc1.weight", false) == TpSplit::kDim0);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc2.weight", true) == TpSplit::kDim1);
  CHECK(tp_split_of("decoder.layers.0.mlp.linear_fc2.bias", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.layers.0.input_layernorm.weight", true) == TpSplit::kWhole);
  CHECK(tp_split_of("decoder.final_layernorm.bias", true) == TpSplit::kWhole);
  CHECK(tp_split_of("output_layer.weight", true) == TpSplit::kDim0);
  CHECK(tp_split_of("output_layer._extra_state", true) == TpSplit::kExtraState);
  // Unknown kinds are not guessed.
  CHECK_FALSE(tp_split_of("decoder.layers.0.mlp.router.weight", true));
  CHECK_FALSE(tp_split_of("decoder.layers.0.mlp.linear_fc1.scale", true));
  CHECK_FALSE(tp_split_of("weight", true));
}

TEST_CASE("rank folder names as get_checkpoint_name writes them", "[formats][megatron_legacy]") {
  CHECK(rank_folder_name(1, 0, 0, 1, 1) == "mp_rank_01");
  CHECK(rank_folder_name(1, 3, 0, 4, 1) == "mp_rank_01_003");
  CHECK(rank_folder_name(0, 1, 2, 2, 4) == "mp_rank_00_001_002");
  CHECK(rank_folder_name(123, 0, 0, 1, 1) == "mp_rank_123");
  auto n = parse_rank_folder("mp_rank_01_003");
  REQUIRE(n);
  CHECK(n->tp == 1);
  CHECK(n->second == 3);
  CHECK_FALSE(n->third);
  CHECK_FALSE(parse_rank_folder("mp_rank_"));
  CHECK_FALSE(parse_rank_folder("mp_rank_01_"));
  CHECK_FALSE(parse_rank_folder("mp_rank_0a"));
  CHECK_FALSE(parse_rank_folder("mp_rank_01_002_003_004"));
  CHECK_FALSE(parse_rank_folder("mp_rank_01_model_states.pt"));
}

TEST_CASE("the layer index is the first number after a `layers` component", "[formats][megatron_legacy]") {
  auto at = layer_index_in("decoder.layers.12.mlp.linear_fc1.weight");
  REQUIRE(at);
  CHECK(at->index == 12);
  CHECK(at->pos == 15);
  CHECK(at->len == 2);
  CHECK_FALSE(layer_index_in("decoder.final_layernorm.weight"));
  CHECK_FALSE(layer_index_in("decoder.sublayers.3.weight"));
}

TEST_CASE("merged TP pieces point into each rank's file", "[formats][megatron_legacy]") {
  CheckpointModel m = read_legacy(testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007"), nullptr, "model");
  CHECK(m.info.kind == SourceKind::kMegatronLegacy);
  CHECK(m.info.files.size() == 4);
  // SwiGLU linear_fc1 of global layer 2 (stage 1's layer 0): [24, 8] from
  // each TP rank's [gate_r; up_r] of 12 rows: gate_0, gate_1, up_0, up_1.
  const TensorEntry& fc1 = tensor_at(m, "decoder.layers.2.mlp.linear_fc1.weight");
  CHECK(fc1.shape == Shape{24, 8});
  REQUIRE(fc1.chunks.size() == 4);
  CHECK(fc1.chunks[0].offsets == Shape{0, 0});
  CHECK(fc1.chunks[1].offsets == Shape{12, 0});
  CHECK(fc1.chunks[1].storage_offset == fc1.chunks[0].storage_offset + 6 * 8);
  CHECK(fc1.chunks[2].offsets == Shape{6, 0});
  CHECK(fc1.chunks[3].offsets == Shape{18, 0});
  CHECK(fc1.chunks[0].file.find("mp_rank_00_001") != std::string::npos);
  CHECK(fc1.chunks[2].file.find("mp_rank_01_001") != std::string::npos);
  // Row-parallel: on dim 1.
  const TensorEntry& proj = tensor_at(m, "decoder.layers.0.self_attention.linear_proj.weight");
  CHECK(proj.shape == Shape{8, 8});
  REQUIRE(proj.chunks.size() == 2);
  CHECK(proj.chunks[1].offsets == Shape{0, 4});
  // Whole on every TP rank: one chunk, TP rank 0's.
  const TensorEntry& norm = tensor_at(m, "decoder.final_layernorm.weight");
  REQUIRE(norm.chunks.size() == 1);
  CHECK(norm.chunks[0].file.find("mp_rank_00_001") != std::string::npos);
}

TEST_CASE("a legacy checkpoint's --only optim is refused, saying so", "[formats][megatron_legacy]") {
  try {
    read_legacy(testdata("megatron_legacy/gpt_tp2pp2/ckpt/iter_0000007"), nullptr, "optim");
    FAIL("read");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnimplemented);
    CHECK(std::string(e.what()).find("not supported yet") != std::string::npos);
  }
}
