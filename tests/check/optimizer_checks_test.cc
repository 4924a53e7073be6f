#include <catch2/catch.hpp>

#include "check/optimizer_checks.h"

using namespace ckpt;
using pickle::Value;
using pickle::ValuePtr;

namespace {
// {"model": {"w": T(4,2), "b": T(4)}, "optim": {"state": {...}, "param_groups": [{"params": [...]}]}}
struct Fixture {
  CheckpointModel model;
  ValuePtr tensor(Shape shape) {
    TensorEntry t;
    t.name = std::string("t") + std::to_string(model.tensors.size());
    t.shape = std::move(shape);
    model.tensors.push_back(t);
    return make_tensor_ref(model.tensors.size() - 1);
  }
  void build(std::vector<std::pair<std::string, Shape>> state, std::vector<std::string> params) {
    ValuePtr m = Value::dict({{Value::str("w"), tensor({4, 2})}, {Value::str("b"), tensor({4})}});
    std::vector<std::pair<ValuePtr, ValuePtr>> st;
    for (auto& [name, shape] : state)
      st.emplace_back(Value::str(name),
                      Value::dict({{Value::str("step"), tensor({})}, {Value::str("exp_avg"), tensor(shape)}}));
    std::vector<ValuePtr> ps;
    for (auto& p : params) ps.push_back(Value::str(p));
    ValuePtr groups =
        Value::list({Value::dict({{Value::str("lr"), Value::floating(0.1)}, {Value::str("params"), Value::list(ps)}})});
    ValuePtr optim = Value::dict({{Value::str("state"), Value::dict(st)}, {Value::str("param_groups"), groups}});
    model.root = Value::dict({{Value::str("model"), m}, {Value::str("optim"), optim}});
  }
};

std::vector<std::string> messages(const ProblemSink& sink) {
  std::vector<std::string> out;
  for (const auto& p : sink.problems()) out.push_back(p.message);
  return out;
}
}  // namespace

TEST_CASE("optimizer state matching param_groups and the model's shapes has no problems", "[check]") {
  Fixture f;
  f.build({{"w", {4, 2}}, {"b", {4}}}, {"w", "b"});
  ProblemSink sink;
  CHECK(check::check_optimizer_state(f.model, true, sink) == 1);
  CHECK(sink.problems().empty());
}

TEST_CASE("state for an unlisted parameter, a wrong shape and an unknown parameter are each named", "[check]") {
  Fixture f;
  f.build({{"w", {2, 4}}, {"ghost", {1}}}, {"w", "b", "nope"});
  ProblemSink sink;
  check::check_optimizer_state(f.model, true, sink);
  auto m = messages(sink);
  REQUIRE(m.size() == 3);
  CHECK(m[0] == "'optim.param_groups.0.params' lists parameter 'nope', which the model does not hold");
  CHECK(m[1] == "optimizer state 'optim.state.w.exp_avg' has shape (2, 4), its parameter 'w' has shape (4, 2)");
  CHECK(m[2] ==
        "optimizer state 'optim.state.ghost' is for parameter 'ghost', which no param_groups entry of 'optim' lists");
  CHECK(sink.problems()[2].tensor == "optim.state.ghost");
}

TEST_CASE("a parameter in two groups is named", "[check]") {
  Fixture f;
  f.build({}, {"w", "w"});
  ProblemSink sink;
  check::check_optimizer_state(f.model, true, sink);
  REQUIRE(sink.problems().size() == 1);
  CHECK(sink.problems()[0].message == "parameter 'w' is listed twice in param_groups 0 of 'optim'");
}

TEST_CASE("a group without params is a problem of a complete model, and stops the matching", "[check]") {
  Fixture f;
  f.build({{"w", {4, 2}}}, {"w"});
  f.model.root->get("optim")->get("param_groups")->items[0]->entries.pop_back();  // drop "params"
  ProblemSink complete, partial;
  check::check_optimizer_state(f.model, true, complete);
  check::check_optimizer_state(f.model, false, partial);
  REQUIRE(complete.problems().size() == 1);
  CHECK(complete.problems()[0].message == "'optim.param_groups.0.params' is missing or not a list of parameters");
  CHECK(partial.problems().empty());
}

TEST_CASE("the flattened optimizer form (torchtitan) is checked the same way", "[check]") {
  Fixture f;
  ValuePtr m = Value::dict({{Value::str("fc.weight"), f.tensor({4, 2})}, {Value::str("fc.bias"), f.tensor({4})}});
  auto flat = [&](Shape weight_state, const char* extra_state, const char* extra_group) {
    std::vector<std::pair<ValuePtr, ValuePtr>> e = {{Value::str("state.fc.weight.exp_avg"), f.tensor(weight_state)},
                                                    {Value::str("state.fc.weight.step"), f.tensor({})},
                                                    {Value::str("state.fc.bias.exp_avg"), f.tensor({4})},
                                                    {Value::str("param_groups.fc.weight.lr"), Value::floating(0.1)},
                                                    {Value::str("param_groups.fc.bias.lr"), Value::floating(0.1)}};
    if (extra_state) e.emplace_back(Value::str(extra_state), f.tensor({1}));
    if (extra_group) e.emplace_back(Value::str(extra_group), Value::floating(0.1));
    f.model.root = Value::dict({{Value::str("model"), m}, {Value::str("optimizer"), Value::dict(e)}});
  };
  flat({4, 2}, nullptr, nullptr);
  ProblemSink ok;
  CHECK(check::check_optimizer_state(f.model, true, ok) == 1);
  CHECK(ok.problems().empty());

  flat({2, 4}, "state.ghost.exp_avg", "param_groups.nope.lr");
  ProblemSink sink;
  CHECK(check::check_optimizer_state(f.model, true, sink) == 1);
  auto msgs = messages(sink);
  REQUIRE(msgs.size() == 3);
  CHECK(msgs[0] == "'optimizer.param_groups.nope' is for parameter 'nope', which the model does not hold");
  CHECK(msgs[1] ==
        "optimizer state 'optimizer.state.fc.weight.exp_avg' has shape (2, 4), its parameter 'fc.weight' has shape "
        "(4, 2)");
  CHECK(msgs[2] ==
        "optimizer state 'optimizer.state.ghost.exp_avg' is for parameter 'ghost', which no "
        "param_groups entry of 'optimizer' names");
}
