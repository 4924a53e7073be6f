#include <catch2/catch.hpp>

#include "core/error.h"
#include "model/unflatten.h"
#include "plan/select.h"

using namespace ckpt;
using pickle::Value;

namespace {
CheckpointModel two_part_model() {
  CheckpointModel m;
  m.source = "src";
  Unflattener u;
  for (const char* name : {"model.w", "optim.state.w.exp_avg", "optim.state.w.step"}) {
    TensorEntry t;
    t.name = name;
    t.shape = {2};
    m.tensors.push_back(t);
  }
  u.set({Value::str("model"), Value::str("w")}, make_tensor_ref(0));
  u.set({Value::str("optim"), Value::str("state"), Value::str("w"), Value::str("exp_avg")}, make_tensor_ref(1));
  u.set({Value::str("optim"), Value::str("state"), Value::str("w"), Value::str("step")}, make_tensor_ref(2));
  u.set({Value::str("optim"), Value::str("param_groups"), Value::integer(0), Value::str("lr")}, Value::floating(0.1));
  m.root = u.root();
  return m;
}
}  // namespace

TEST_CASE("only option makes one top-level entry the root and renumbers its tensors", "[plan]") {
  auto m = select_entries(two_part_model(), {"optim", "", std::nullopt});
  REQUIRE(m.tensors.size() == 2);
  CHECK(m.tensors[0].name == "state.w.exp_avg");
  CHECK(m.root->repr(6, 10) ==
        "{'state': {'w': {'exp_avg': ckptconv.tensor(0), 'step': ckptconv.tensor(1)}}, 'param_groups': [{'lr': 0.1}]}");
  auto model = select_entries(two_part_model(), {"model", "", std::nullopt});
  REQUIRE(model.tensors.size() == 1);
  CHECK(model.tensors[0].name == "w");
  CHECK(model.root->repr() == "{'w': ckptconv.tensor(0)}");
}

TEST_CASE("only optim also selects a top-level 'optimizer' (torchtitan, Accelerate)", "[plan]") {
  CheckpointModel m;
  m.source = "src";
  Unflattener u;
  u.set({Value::str("model"), Value::str("w")}, Value::integer(1));
  u.set({Value::str("optimizer"), Value::str("param_groups.w.lr")}, Value::floating(0.1));
  m.root = u.root();
  CHECK(select_entries(m, {"optim", "", std::nullopt}).root->repr() == "{'param_groups.w.lr': 0.1}");
}

TEST_CASE("only and keys together match paths below the new root", "[plan]") {
  auto m = select_entries(two_part_model(), {"optim", "^state\\.w\\.step$", std::nullopt});
  REQUIRE(m.tensors.size() == 1);
  CHECK(m.tensors[0].name == "state.w.step");
  CHECK_THROWS_AS(select_entries(two_part_model(), {"optim", "^optim\\.", std::nullopt}), Error);
}

TEST_CASE("keys option keeps matching leaves and whole lists", "[plan]") {
  auto m = select_entries(two_part_model(), {"", "exp_avg|lr", std::nullopt});
  REQUIRE(m.tensors.size() == 1);
  CHECK(m.root->repr(6, 10) ==
        "{'optim': {'state': {'w': {'exp_avg': ckptconv.tensor(0)}}, 'param_groups': [{'lr': 0.1}]}}");
}

TEST_CASE("selection errors are usage errors", "[plan]") {
  CHECK_THROWS_AS(select_entries(two_part_model(), {"", "nomatch", std::nullopt}), Error);
  CHECK_THROWS_AS(select_entries(two_part_model(), {"", "(", std::nullopt}), Error);
  CHECK_THROWS_AS(select_entries(two_part_model(), {"weights", "", std::nullopt}), Error);
  try {
    CheckpointModel m = two_part_model();
    m.root = Value::dict({{Value::str("module"), Value::integer(1)}});
    select_entries(m, {"model", "", std::nullopt});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("no top-level 'model' entry (its top-level keys: module)") != std::string::npos);
  }
}

TEST_CASE("dtype option casts the model's floating tensors, the optimizer's only when asked", "[plan]") {
  auto m = two_part_model();
  CastCounts n = apply_cast(m, DType::kBFloat16, std::nullopt);
  CHECK(m.tensors[0].output_dtype() == DType::kBFloat16);
  CHECK(m.tensors[1].output_dtype() == DType::kFloat32);  // exp_avg: a resumed job reads what it saved
  CHECK(m.tensors[2].output_dtype() == DType::kFloat32);
  CHECK((n.model_cast == 1 && n.optim_cast == 0 && n.optim_kept == 1));
  n = apply_cast(m, std::nullopt, DType::kFloat16);
  CHECK(m.tensors[1].output_dtype() == DType::kFloat16);
  CHECK(m.tensors[2].output_dtype() == DType::kFloat32);  // step counters never
  CHECK((n.model_cast == 0 && n.optim_cast == 1 && n.optim_kept == 0));
  // an optimizer's own state dict is all optimizer state
  auto optim = select_entries(two_part_model(), {"optim", "", std::nullopt});
  CHECK(optimizer_state_tensors(optim) == std::vector<bool>{true, true});
  CHECK(apply_cast(optim, DType::kBFloat16, std::nullopt).optim_kept == 1);
  CHECK(optim.tensors[0].output_dtype() == DType::kFloat32);
  CHECK(parse_dtype_option("keep") == std::nullopt);
  CHECK_THROWS_AS(parse_dtype_option("int8"), Error);
}

TEST_CASE("dtype option leaves float4 tensors packed and counts them", "[plan]") {
  auto m = two_part_model();
  m.tensors[0].dtype = DType::kFloat4E2M1FNx2;
  CastCounts n = apply_cast(m, DType::kBFloat16, DType::kBFloat16);
  CHECK(m.tensors[0].output_dtype() == DType::kFloat4E2M1FNx2);
  CHECK(m.tensors[1].output_dtype() == DType::kBFloat16);
  CHECK((n.packed_kept == 1 && n.model_cast == 0 && n.optim_cast == 1));
}

TEST_CASE("only with keep_nesting keeps the entry under its key (reshard)", "[plan]") {
  auto m = select_entries(two_part_model(), {"model", "", std::nullopt, true});
  REQUIRE(m.tensors.size() == 1);
  CHECK(m.tensors[0].name == "model.w");
  CHECK(m.root->repr() == "{'model': {'w': ckptconv.tensor(0)}}");
}
