#include "model/value_json.h"

#include <cmath>

#include "model/checkpoint_model.h"

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
        for (const auto& [k, val] : v.entries) out[k->text] = value_to_json(*val);
        return out;
      }
      nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
      for (const auto& [k, val] : v.entries) pairs.push_back({value_to_json(*k), value_to_json(*val)});
      return {{"__items__", pairs}};
    }
    default: return {{"__repr__", v.repr(4, 64)}};
  }
}

}  // namespace ckpt
