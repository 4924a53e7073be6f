// Non-tensor values as JSON, for `inspect --json` and HDF5 attributes.
// Lossless for what state dicts hold (None, bool, int, float, str, lists,
// tuples, dicts with string or int keys); other values become their repr
// under {"__repr__": ...}. Non-finite floats become {"__float__": "nan"}.
#pragma once

#include <nlohmann/json.hpp>

#include "pickle/value.h"

namespace ckpt {

nlohmann::ordered_json value_to_json(const pickle::Value& value);

}  // namespace ckpt
