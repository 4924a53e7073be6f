#include "model/value_json.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/checkpoint_model.h"
#include "model/ordered_json.h"

namespace ckpt {

nlohmann::ordered_json value_to_json(const pickle::Value& v) {
  using pickle::Kind;
  if (auto idx = tensor_ref_index(v)) return {{"__tensor__", *idx}};
  if (v.is(Kind::kBuilt) && v.object && v.object->is(Kind::kDict)) return value_to_json(*v.object);
  switch (v.kind) {
    case Kind::kNone: return nullptr;
    case Kind::kBool: return v.bool_value;
    case Kind::kInt: return v.int_value;
    case Kind::kFloat:
      if (std::isfinite(v.float_value)) return v.float_value;
      return {{"__float__", std::isnan(v.float_value) ? "nan" : (v.float_value > 0 ? "inf" : "-inf")}};
    case Kind::kStr: return v.text;
    case Kind::kList:
    case Kind::kTuple: {
      nlohmann::ordered_json arr = nlohmann::ordered_json::array();
      for (const auto& item : v.items) arr.push_back(value_to_json(*item));
      if (v.is(Kind::kTuple)) return {{"__tuple__", arr}};
      return arr;
    }
    case Kind::kDict: {
      bool string_keys = true;
      for (const auto& [k, _] : v.entries) string_keys = string_keys && k->is(Kind::kStr);
      if (string_keys) {
        nlohmann::ordered_json out = nlohmann::ordered_json::object();
        for (const auto& [k, val] : v.entries)
          append_member(out, k->text, value_to_json(*val));  // str keys are distinct
        return out;
      }
      nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
      for (const auto& [k, val] : v.entries) pairs.push_back({value_to_json(*k), value_to_json(*val)});
      return {{"__items__", pairs}};
    }
    default: return {{"__repr__", v.repr(4, 64)}};
  }
}

namespace {

using Json = nlohmann::ordered_json;
using pickle::Value;
using pickle::ValuePtr;
using TensorFn = std::function<ValuePtr(const Json&)>;

ValuePtr from_json(const Json& j, const TensorFn& tensor, int depth);

// The one-key objects value_to_json writes for what JSON lacks; nullptr for
// an ordinary object.
ValuePtr from_tagged(const Json& j, const TensorFn& tensor, int depth) {
  if (j.size() != 1) return nullptr;
  const std::string& key = j.begin().key();
  const Json& v = j.begin().value();
  if (key == "__tensor__") return tensor(v);
  if (key == "__tuple__" && v.is_array()) return Value::tuple(from_json(v, tensor, depth - 1)->items);
  if (key == "__float__" && v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    double inf = std::numeric_limits<double>::infinity();
    return Value::floating(s == "nan" ? std::nan("") : s == "-inf" ? -inf : inf);
  }
  if (key == "__repr__" && v.is_string()) return Value::str(v.get<std::string>());
  if (key == "__items__" && v.is_array()) {
    std::vector<std::pair<ValuePtr, ValuePtr>> entries;
    for (const auto& pair : v) {
      if (!pair.is_array() || pair.size() != 2) fail_data_loss("JSON value: __items__ entry is not a pair");
      entries.emplace_back(from_json(pair[0], tensor, depth - 1), from_json(pair[1], tensor, depth - 1));
    }
    return Value::dict(std::move(entries));
  }
  return nullptr;
}

ValuePtr from_json(const Json& j, const TensorFn& tensor, int depth) {
  if (depth < 0) fail_data_loss("JSON value nests too deeply");
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return Value::floating(j.get<double>());
      return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case Json::value_t::number_float: return Value::floating(j.get<double>());
    case Json::value_t::string: return Value::str(j.get<std::string>());
    case Json::value_t::array: {
      std::vector<ValuePtr> items;
      for (const auto& v : j) items.push_back(from_json(v, tensor, depth - 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      if (ValuePtr tagged = from_tagged(j, tensor, depth - 1)) return tagged;
      std::vector<std::pair<ValuePtr, ValuePtr>> entries;
      for (auto it = j.begin(); it != j.end(); ++it)
        entries.emplace_back(Value::str(it.key()), from_json(it.value(), tensor, depth - 1));
      return Value::dict(std::move(entries));
    }
    default: fail_data_loss("JSON value of an unexpected type");
  }
}

}  // namespace

ValuePtr value_from_json(const Json& json, const TensorFn& tensor, int max_depth) {
  return from_json(json, tensor, max_depth);
}

}  // namespace ckpt
