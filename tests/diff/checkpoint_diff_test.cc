#include <catch2/catch.hpp>

#include <sstream>

#include "diff/checkpoint_diff.h"
#include "diff/diff_report.h"

using namespace ckpt;
using pickle::Value;

namespace {

std::string floats(std::vector<float> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

// {"w": tensor(values), "lr": lr, <extra>: tensor} as a reader would give it.
CheckpointModel model(std::vector<float> w, double lr, const std::string& extra = "") {
  CheckpointModel m;
  m.source = "mem";
  auto add = [&](const std::string& name, std::vector<float> values) {
    TensorEntry t;
    t.name = name;
    t.shape = {static_cast<int64_t>(values.size())};
    t.chunks = {{{0}, t.shape, make_memory_source(floats(values)), 0, {1}, std::nullopt, name, 0, ""}};
    m.tensors.push_back(t);
    return make_tensor_ref(m.tensors.size() - 1);
  };
  std::vector<std::pair<pickle::ValuePtr, pickle::ValuePtr>> entries = {{Value::str("w"), add("w", w)},
                                                                        {Value::str("lr"), Value::floating(lr)}};
  if (!extra.empty()) entries.push_back({Value::str(extra), add(extra, {1})});
  m.root = Value::dict(entries);
  return m;
}

}  // namespace

TEST_CASE("equal models: no differences, exit-0 verdict", "[diff]") {
  DiffReport r = diff_models(model({1, 2}, 0.1), model({1, 2}, 0.1), {});
  CHECK(r.equal());
  CHECK(r.values_compared == 1);
  REQUIRE(r.tensors.size() == 1);
  CHECK(r.tensors[0].values->elements == 2);
  CHECK(diff_to_json(r)["equal"] == true);
}

TEST_CASE("keys on one side, changed values and elements are each reported", "[diff]") {
  DiffReport r = diff_models(model({1, 2}, 0.1, "only_a"), model({1, 2.5}, 0.2, "only_b"), {});
  CHECK_FALSE(r.equal());
  CHECK(r.only_in_a == std::vector<std::string>{"only_a"});
  CHECK(r.only_in_b == std::vector<std::string>{"only_b"});
  REQUIRE(r.values.size() == 1);
  CHECK(r.values[0].path == "lr");
  CHECK(r.values[0].a == 0.1);
  CHECK(r.tensors_differing() == 1);
  std::ostringstream table;
  print_diff_table(r, table);
  CHECK(table.str().find("! w  float32  (2,)  1 of 2 elements outside tolerance; max abs diff 0.5 at [1] (2 vs 2.5)") !=
        std::string::npos);
  CHECK(table.str().find("! lr  0.1 vs 0.2") != std::string::npos);
  auto j = diff_to_json(r);
  CHECK(j["schema_version"] == kDiffSchemaVersion);
  CHECK(j["summary"]["elements_mismatched"] == 1);
  CHECK(j["tensors"][0]["values"]["first_mismatch"]["index"] == nlohmann::json::array({1}));
}

TEST_CASE("a tolerance or an ignored dtype turns differences into equality", "[diff]") {
  DiffOptions loose;
  loose.tolerance.atol = 0.5;
  CHECK(diff_models(model({1, 2}, 0.1), model({1, 2.5}, 0.1), loose).equal());
  CheckpointModel b = model({1, 2}, 0.1);
  b.tensors[0].dtype = DType::kInt32;  // same bytes read as int32: dtype and values differ
  DiffOptions ignore;
  ignore.ignore_dtype = true;
  DiffReport r = diff_models(model({1, 2}, 0.1), b, ignore);
  CHECK(r.tensors[0].dtype_differs());
  CHECK(r.tensors[0].values->mismatched == 2);
}

TEST_CASE("non-finite numbers in JSON are strings", "[diff]") {
  CHECK(number_json(1.5) == 1.5);
  CHECK(number_json(std::numeric_limits<double>::quiet_NaN()) == "nan");
  CHECK(number_json(-std::numeric_limits<double>::infinity()) == "-inf");
}
