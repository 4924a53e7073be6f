// The pure pieces of the DeepSpeed pipeline and MoE readers
// (formats/zero/pipeline_layers.h, formats/zero/moe_experts.h).
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/zero/moe_experts.h"
#include "formats/zero/pipeline_layers.h"

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
  CHECK_THROWS_AS(stage_layers({{"tied_modules.e.weight"}}, files, "DIR"), Error);
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
