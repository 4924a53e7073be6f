#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "formats/detect.h"
#include "formats/ds_universal/ds_universal_writer.h"
#include "model/tree_walk.h"

using namespace ckpt;
using namespace ckpt::ds_universal;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

std::string testdata(const std::string& rel) { return std::string(CKPT_SOURCE_DIR) + "/testdata/" + rel; }

const UniversalFile& file_named(const UniversalPlan& plan, const std::string& path) {
  for (const auto& f : plan.files)
    if (f.path == path) return f;
  FAIL("no file " << path);
  throw;
}

std::vector<std::string> keys(const Value& dict) {
  std::vector<std::string> out;
  for (const auto& [k, v] : dict.entries) out.push_back(path_component(*k));
  return out;
}

}  // namespace

TEST_CASE("a ZeRO checkpoint's universal plan: files, dict shapes, groups and roles", "[formats][ds_universal]") {
  CheckpointModel model = read_checkpoint(testdata("zero/z2_2groups_ws2"));
  UniversalPlan plan = plan_universal(model, 2);
  CHECK(plan.params == 5);  // out_bias, l1.weight, l1.bias, l2.weight, head.weight
  CHECK(plan.others == 3);  // frozen.weight, head_tied.weight, scale
  // 5 x (fp32, step, exp_avg, exp_avg_sq) + 3 fp32 + optimizer_state + two model-states files
  CHECK(plan.files.size() == 5 * 4 + 3 + 1 + 2);

  const UniversalFile& fp32 = file_named(plan, "zero/l1.weight/fp32.pt");
  CHECK(keys(*fp32.root) == std::vector<std::string>{"cat_dim", "param"});
  REQUIRE(fp32.tensors.size() == 1);
  CHECK(fp32.tensors[0].dtype == DType::kFloat32);
  CHECK(fp32.tensors[0].shape == Shape{7, 6});
  CHECK(model.tensors.at(fp32.sources[0].model_tensor).name == "model.l1.weight");

  const UniversalFile& step = file_named(plan, "zero/l1.weight/step.pt");
  CHECK(tensor_ref_index(*step.root));  // a bare 0-d tensor
  CHECK(step.tensors.at(0).shape.empty());
  CHECK(step.tensors.at(0).dtype == DType::kFloat32);

  const UniversalFile& frozen = file_named(plan, "zero/frozen.weight/fp32.pt");
  CHECK(keys(*frozen.root) == std::vector<std::string>{"param"});
  CHECK(frozen.tensors.at(0).dtype == DType::kFloat32);  // the bf16 weight, cast

  const UniversalFile& osd = file_named(plan, "zero/optimizer_state.pt");
  CHECK(keys(*osd.root) == std::vector<std::string>{"ds_version", "param_groups", "optimizer_state_dict"});
  const Value& groups = *osd.root->get("param_groups");
  REQUIRE(groups.items.size() == 2);
  CHECK(groups.items[1]->get("params")->items.at(0)->int_value == 1);
  CHECK(groups.items[1]->get("lr")->float_value == Approx(3e-3));
  CHECK(keys(*osd.root->get("optimizer_state_dict")->get("state")) == std::vector<std::string>{"0", "1"});

  const UniversalFile& states = file_named(plan, "mp_rank_00_model_states.pt");
  const Value& root = *states.root;
  CHECK(root.get("dp_world_size")->int_value == 2);
  CHECK(root.get("mp_world_size")->int_value == 1);
  CHECK(root.get("global_steps")->int_value == 3);
  const Value& shapes = *root.get("param_shapes");
  REQUIRE(shapes.items.size() == 2);
  CHECK(keys(*shapes.items[0]) == std::vector<std::string>{"l1.weight", "l2.weight", "head.weight"});
  CHECK(keys(*shapes.items[1]) == std::vector<std::string>{"out_bias", "l1.bias"});
  CHECK(root.get("buffer_names")->items.at(0)->text == "scale");
  CHECK(keys(*root.get("frozen_param_shapes")) == std::vector<std::string>{"frozen.weight"});
  CHECK(root.get("shared_params")->get("head_tied.weight")->text == "head.weight");
  CHECK(keys(root) == keys(*file_named(plan, "zero_pp_rank_0_mp_rank_00_model_states.pt").root));
}

TEST_CASE("what a universal checkpoint cannot hold is refused before anything is written", "[formats][ds_universal]") {
  auto t = [](std::size_t i) { return make_tensor_ref(i); };
  auto str = [](const std::string& s) { return Value::str(s); };
  CheckpointModel model;
  model.source = "src";
  TensorEntry w;
  w.name = "w";
  w.shape = {2};
  model.tensors = {w, w};
  model.tensors[1].shape = {3};
  auto with_state = [&](ValuePtr state_key, ValuePtr param_name, std::size_t exp_avg) {
    auto state = Value::dict({{state_key, Value::dict({{str("exp_avg"), t(exp_avg)}})}});
    auto groups = Value::list({Value::dict({{str("params"), Value::list({state_key})}})});
    model.root = Value::dict({{str("model"), Value::dict({{param_name, t(0)}})},
                              {str("optim"), Value::dict({{str("state"), state}, {str("param_groups"), groups}})}});
  };
  with_state(str("w"), str("w"), 0);
  CHECK(plan_universal(model, 1).params == 1);
  with_state(Value::integer(0), str("w"), 0);
  CHECK_THROWS_WITH(plan_universal(model, 1), Catch::Contains("keyed by parameter index"));
  with_state(str("../w"), str("../w"), 0);
  CHECK_THROWS_WITH(plan_universal(model, 1), Catch::Contains("cannot be a file or folder name"));
  with_state(str("w"), str("w"), 1);
  CHECK_THROWS_WITH(plan_universal(model, 1), Catch::Contains("has shape (3,), the parameter (2,)"));
  with_state(str("v"), str("w"), 0);
  CHECK_THROWS_WITH(plan_universal(model, 1), Catch::Contains("'v', which is not a tensor of model"));
  model.root = Value::dict({{str("model"), Value::dict({{str("w"), t(0)}})}});
  CHECK_THROWS_WITH(plan_universal(model, 1), Catch::Contains("'model' and 'optim'"));
}

TEST_CASE("a MoE checkpoint at ep 2: each local expert's files stack the expert-parallel ranks' experts",
          "[formats][ds_universal]") {
  CheckpointModel model = read_checkpoint(testdata("zero_parallel/moe_z2_bf16_ws4_ep2"));
  REQUIRE(model.info.parallel);
  REQUIRE(model.info.parallel->expert == 2);
  UniversalPlan plan = plan_universal(model, 4);
  CHECK(plan.params == 13);  // 5 dense + 4 experts x (weight, bias)
  const std::string e = "zero/moe.deepspeed_moe.experts.deepspeed_experts.";
  std::set<std::string> paths;
  for (const auto& f : plan.files) paths.insert(f.path);
  CHECK(paths.count(e + "1.weight/fp32.pt") == 1);
  CHECK(paths.count(e + "2.weight/fp32.pt") == 0);  // global ids >= 2 live in folders 0 and 1
  CHECK(paths.count(e + "3.bias/exp_avg.pt") == 0);

  const UniversalFile& fp32 = file_named(plan, e + "1.weight/fp32.pt");
  CHECK(keys(*fp32.root) == std::vector<std::string>{"cat_dim", "param", "is_expert_param", "ep_num_experts"});
  CHECK(fp32.root->get("is_expert_param")->bool_value);
  CHECK(fp32.root->get("ep_num_experts")->int_value == 2);
  REQUIRE(fp32.tensors.size() == 1);
  CHECK(fp32.tensors[0].shape == Shape{2, 8, 8});
  CHECK(fp32.tensors[0].dtype == DType::kFloat32);
  // local expert 1 of rank 0 is global 1, of rank 1 global 3
  std::vector<std::string> stacked;
  for (std::size_t i : fp32.sources[0].stacked) stacked.push_back(model.tensors.at(i).name);
  CHECK(stacked == std::vector<std::string>{"model.moe.deepspeed_moe.experts.deepspeed_experts.1.weight",
                                            "model.moe.deepspeed_moe.experts.deepspeed_experts.3.weight"});
  const UniversalFile& avg = file_named(plan, e + "0.bias/exp_avg.pt");
  CHECK(avg.tensors.at(0).shape == Shape{2, 8});
  const UniversalFile& step = file_named(plan, e + "0.bias/step.pt");
  CHECK(tensor_ref_index(*step.root));
  CHECK(file_named(plan, "zero/inp.weight/fp32.pt").sources.at(0).stacked.empty());
}
