// Non-tensor values as JSON, for `inspect --json` and HDF5 attributes.
// Lossless for what state dicts hold (None, bool, int, float, str, lists,
// tuples, dicts with string or int keys); other values become their repr
// under {"__repr__": ...}. Non-finite floats become {"__float__": "nan"}.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "pickle/value.h"

namespace ckpt {

nlohmann::ordered_json value_to_json(const pickle::Value& value);

// The inverse for what value_to_json writes: lists come back as lists,
// {"__tuple__"} as tuples, {"__items__"} as dicts with non-string keys,
// {"__float__"} as non-finite floats, {"__repr__"} as the repr string.
// `tensor` turns a {"__tensor__": x} object into a value (a tensor
// reference); DataLoss when nesting exceeds `max_depth`.
pickle::ValuePtr value_from_json(const nlohmann::ordered_json& json,
                                 const std::function<pickle::ValuePtr(const nlohmann::ordered_json& ref)>& tensor,
                                 int max_depth = 200);

}  // namespace ckpt
