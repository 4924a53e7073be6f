// The pure pieces of the DeepSpeed pipeline, MoE and tensor-parallel readers
// (formats/zero/pipeline_layers.h, formats/zero/moe_experts.h,
// formats/zero/tensor_parallel.h).
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/zero/moe_experts.h"
#include "formats/zero/pipeline_layers.h"
#include "formats/zero/tensor_parallel.h"
#include "io/byte_source.h"
#include "model/tensor_compare.h"

using namespace ckpt;
using namespace ckpt::zero;

TEST_CASE("pipeline names give their layer index", "[formats][zero]") {
  CHECK(pipeline_layer_of("3.weight") == 3);
  CHECK(pipeline_layer_of("12.proj.bias") == 12);
  CHECK_FALSE(pipeline_layer_of("tied_modules.embed.weight"));
  CHECK_FALSE(pipeline_layer_of(".weight"));
  CHECK_FALSE(pipeline_layer_of("3"));
  CHECK_FALSE(pipeline_layer_of("3a.weight"));
  CHECK(layer_file_name(3) == "layer_03-model_states.pt");
  CHECK(layer_file_name(123) == "layer_123-model_states.pt");
  CHECK(layer_file_name(3, 1) == "layer_03-model_01-model_states.pt");
  CHECK(tied_key_of("tied_modules.embed.weight") == "embed");
  CHECK(tied_key_of("tied_modules.embed.norm.bias") == "embed");
  CHECK_FALSE(tied_key_of("tied_modules..weight"));
  CHECK_FALSE(tied_key_of("tied_modules.embed"));
  CHECK_FALSE(tied_key_of("0.tied_modules.embed.weight"));
}

TEST_CASE("a tied module's layer file is the one whose entries are exactly the module's", "[formats][zero]") {
  std::set<std::string> names = {"tied_modules.embed.weight", "tied_modules.head.weight", "tied_modules.head.bias",
                                 "1.weight"};
  CHECK(tied_key_of_layer({"weight"}, names, "F") == "embed");
  CHECK(tied_key_of_layer({"bias", "weight"}, names, "F") == "head");
  CHECK_FALSE(tied_key_of_layer({"weight", "scale"}, names, "F"));
  // two tied modules of the same entries: nothing says which the file is
  names.insert("tied_modules.pos.weight");
  try {
    tied_key_of_layer({"weight"}, names, "F");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kUnimplemented);
    CHECK(std::string(e.what()).find("fit tied modules 'embed' and 'pos' alike") != std::string::npos);
  }
}

TEST_CASE("layer files go to the stage that trains them; state-only layers to the stage below", "[formats][zero]") {
  std::map<int, std::string> files = {{0, "a"}, {1, "b"}, {3, "c"}, {4, "d"}, {6, "e"}};
  auto layers = stage_layers({{"0.weight", "1.weight"}, {"3.weight", "6.bias"}}, files, "DIR");
  CHECK(layers == std::vector<std::vector<int>>{{0, 1}, {3, 4, 6}});
}

TEST_CASE("a layer file a stage trains is required, named with its stage", "[formats][zero]") {
  std::map<int, std::string> files = {{0, "a"}};
  try {
    stage_layers({{"0.weight"}, {"4.weight"}}, files, "DIR");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kNotFound);
    CHECK(std::string(e.what()).find("the layer file layer_04-model_states.pt of pipeline stage 1 is missing") !=
          std::string::npos);
  }
  CHECK(stage_layers({{"tied_modules.e.weight", "0.weight"}}, files, "DIR") == std::vector<std::vector<int>>{{0}});
  CHECK_THROWS_AS(stage_layers({{"embed.weight"}}, files, "DIR"), Error);  // neither numbered nor tied
  try {
    stage_layers({{"0.weight"}, {"4.weight"}}, files, "DIR", 1);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("layer_04-model_01-model_states.pt of pipeline stage 1") != std::string::npos);
  }
  CHECK_THROWS_AS(stage_layers({{"0.weight"}, {"0.bias"}}, files, "DIR"), Error);  // two stages train layer 0
}

TEST_CASE("expert names give their local index and take a global one", "[formats][zero]") {
  auto e = parse_expert_name("moe.deepspeed_moe.experts.deepspeed_experts.1.weight");
  REQUIRE(e);
  CHECK(e->id == 1);
  CHECK(e->with_id(3) == "moe.deepspeed_moe.experts.deepspeed_experts.3.weight");
  CHECK_FALSE(parse_expert_name("moe.deepspeed_moe.gate.wg.weight"));
  CHECK_FALSE(parse_expert_name("x.deepspeed_experts.a.weight"));
  CHECK(expert_file_name(0, 2) == "layer_0_expert_2_mp_rank_00_model_states.pt");
}

TEST_CASE("expert-data-parallel groups stride by the expert-parallel size", "[formats][zero]") {
  // groups._get_expert_parallel_ranks at world 4, ep 2: expert-parallel groups
  // [0,1], [2,3]; expert-data-parallel groups [0,2], [1,3].
  CHECK(expert_data_parallel_ranks(0, 2, 4) == std::vector<int>{0, 2});
  CHECK(expert_data_parallel_ranks(1, 2, 4) == std::vector<int>{1, 3});
  CHECK(expert_data_parallel_ranks(1, 2, 2) == std::vector<int>{1});
  CHECK(expert_data_parallel_ranks(0, 1, 3) == std::vector<int>{0, 1, 2});
}

TEST_CASE("experts go after the other entries of their MoE module", "[formats][zero]") {
  auto names = [](const std::vector<ModuleEntry>& m) {
    std::vector<std::string> out;
    for (const auto& e : m) out.push_back(e.name);
    return out;
  };
  std::vector<ModuleEntry> module = {{"inp.weight"}, {"moe.deepspeed_moe.gate.wg.weight"}, {"out.weight"}};
  std::vector<ModuleEntry> experts = {{"moe.deepspeed_moe.experts.deepspeed_experts.0.weight"},
                                      {"moe.deepspeed_moe.experts.deepspeed_experts.1.weight"}};
  CHECK(names(with_experts(module, experts)) ==
        std::vector<std::string>{"inp.weight", "moe.deepspeed_moe.gate.wg.weight",
                                 "moe.deepspeed_moe.experts.deepspeed_experts.0.weight",
                                 "moe.deepspeed_moe.experts.deepspeed_experts.1.weight", "out.weight"});
  CHECK(names(with_experts({{"a"}}, {{"x.deepspeed_experts.0.w"}})) ==
        std::vector<std::string>{"a", "x.deepspeed_experts.0.w"});
}

namespace {

// A float32 tensor of `shape` holding `values`, one chunk in memory.
TensorEntry floats(Shape shape, const std::vector<float>& values) {
  TensorEntry t;
  t.name = "t";
  t.dtype = DType::kFloat32;
  t.shape = shape;
  TensorChunk c;
  c.offsets = Shape(shape.size(), 0);
  c.sizes = shape;
  c.strides = contiguous_strides(shape);
  c.storage = make_memory_source(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  t.chunks.push_back(c);
  return t;
}

std::vector<float> range(float from, int n) {
  std::vector<float> out;
  for (int i = 0; i < n; ++i) out.push_back(from + float(i));
  return out;
}

pickle::ValuePtr patterns(const char* key, const char* pattern) {
  return pickle::Value::dict({{pickle::Value::str(key), pickle::Value::list({pickle::Value::str(pattern)})}});
}

}  // namespace

TEST_CASE("tensor-parallel slices merge as ds_to_universal merges their category", "[formats][zero]") {
  // two ranks' [4, 2] slices: rank 0 holds 0..7, rank 1 10..17
  TensorEntry a = floats({4, 2}, range(0, 8)), b = floats({4, 2}, range(10, 8));
  std::vector<const TensorEntry*> slices = {&a, &b};
  auto merged = [&](const pickle::Value& info, const std::string& name) {
    TensorParallelRules rules(info, "F");
    return merge_slices(slices, rules.rule_for(name), rules, name);
  };
  auto info = pickle::Value::dict(
      {{pickle::Value::str("parameter_with_row_parallelism_patterns"), pickle::Value::list({pickle::Value::str("o")})},
       {pickle::Value::str("parameter_with_2_sub_params_cat_dim_0"), pickle::Value::list({pickle::Value::str("w")})},
       {pickle::Value::str("vocabulary_parameter_patterns"), pickle::Value::list({pickle::Value::str("e")})},
       {pickle::Value::str("original_vocab_size"), pickle::Value::integer(7)}});
  // default: dim 0
  CHECK(
      same_tensor_values(merged(*info, "x"), floats({8, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17})));
  // row parallelism: dim 1
  CHECK(same_tensor_values(merged(*info, "o.weight"),
                           floats({4, 4}, {0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 14, 15, 6, 7, 16, 17})));
  // two sub-parameters: the first halves, then the second halves
  CHECK(
      same_tensor_values(merged(*info, "w"), floats({8, 2}, {0, 1, 2, 3, 10, 11, 12, 13, 4, 5, 6, 7, 14, 15, 16, 17})));
  // vocabulary: dim 0, the padding rows from original_vocab_size cut off
  TensorEntry e = merged(*info, "e");
  CHECK(e.shape == Shape{7, 2});
  CHECK(same_tensor_values(e, floats({7, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15})));
  // re.match: anchored at the start only
  CHECK(TensorParallelRules(*info, "F").rule_for("wo").merge.kind == TensorParallelMerge::Kind::kTwoSubParams);
  CHECK(TensorParallelRules(*info, "F").rule_for("xw").merge.kind == TensorParallelMerge::Kind::kCat);
}

TEST_CASE("replicated tensor-parallel slices must be equal", "[formats][zero]") {
  TensorEntry a = floats({3}, range(0, 3)), b = floats({3}, range(0, 3)), c = floats({3}, range(1, 3));
  auto info = patterns("tp_replicated_parameter_patterns", "n");
  TensorParallelRules rules(*info, "F");
  TensorEntry one = merge_slices({&a, &b}, rules.rule_for("n"), rules, "n");
  CHECK(one.shape == Shape{3});
  CHECK(same_tensor_values(one, a));
  try {
    merge_slices({&a, &c}, rules.rule_for("n"), rules, "n");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK(std::string(e.what()).find("'n' (tp_replicated_parameter_patterns) differs") != std::string::npos);
  }
  auto avg = patterns("parameter_to_average_patterns", "n");
  TensorParallelRules averaged(*avg, "F");
  CHECK(same_tensor_values(merge_slices({&a, &b}, averaged.rule_for("n"), averaged, "n"), a));
  CHECK_THROWS_AS(merge_slices({&a, &c}, averaged.rule_for("n"), averaged, "n"), Error);
  auto sub = patterns("parameter_with_sub_params", "n");
  CHECK_THROWS_AS(TensorParallelRules(*sub, "F"), Error);
}
