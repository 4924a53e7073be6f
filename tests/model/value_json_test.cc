#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/checkpoint_model.h"
#include "model/value_json.h"

using namespace ckpt;
using pickle::Kind;
using pickle::Value;
using Json = nlohmann::ordered_json;

namespace {
pickle::ValuePtr no_tensors(const Json&) {
  FAIL("no tensor expected");
  return nullptr;
}
}  // namespace

TEST_CASE("value_from_json inverts value_to_json for state-dict values", "[model]") {
  auto original = Value::dict({
      {Value::str("lr"), Value::floating(0.1)},
      {Value::str("betas"), Value::tuple({Value::floating(0.9), Value::floating(0.999)})},
      {Value::str("params"), Value::list({Value::integer(0), Value::integer(-1099511627776)})},
      {Value::str("nan"), Value::floating(std::nan(""))},
      {Value::str("ninf"), Value::floating(-std::numeric_limits<double>::infinity())},
      {Value::str("by_id"), Value::dict({{Value::integer(3), Value::str("three")}})},
      {Value::str("none"), Value::none()},
      {Value::str("flag"), Value::boolean(true)},
  });
  Json json = value_to_json(*original);
  auto back = value_from_json(json, no_tensors);
  CHECK(value_to_json(*back).dump() == json.dump());
  CHECK(back->at("betas")->is(Kind::kTuple));
  CHECK(back->at("params")->items[1]->int_value == -1099511627776);
  CHECK(std::isnan(back->at("nan")->float_value));
  CHECK(back->at("ninf")->float_value == -std::numeric_limits<double>::infinity());
  const auto& by_id = back->at("by_id")->entries;
  REQUIRE(by_id.size() == 1);
  CHECK(by_id[0].first->is(Kind::kInt));
  CHECK(by_id[0].first->int_value == 3);
}

TEST_CASE("value_from_json hands tensor placeholders to the caller", "[model]") {
  Json json = Json::parse(R"({"w": {"__tensor__": "model.w"}, "x": [1, {"__tensor__": "model.x"}]})");
  std::vector<std::string> seen;
  auto v = value_from_json(json, [&](const Json& ref) {
    seen.push_back(ref.get<std::string>());
    return make_tensor_ref(seen.size() - 1);
  });
  CHECK(seen == std::vector<std::string>{"model.w", "model.x"});
  CHECK(tensor_ref_index(*v->at("w")) == 0u);
  CHECK(tensor_ref_index(*v->at("x")->items[1]) == 1u);
}

TEST_CASE("value_from_json refuses nesting past its depth limit", "[model]") {
  std::string deep(300, '[');
  deep += std::string(300, ']');
  CHECK_THROWS_AS(value_from_json(Json::parse(deep), no_tensors), Error);
  CHECK_NOTHROW(value_from_json(Json::parse(deep), no_tensors, 400));
}
