// Reading Python objects out of a pickle value tree: the class an object was
// made from and the fields of its state, whatever way it was pickled
// (NEWOBJ + BUILD with a dict, __slots__ as (None, {...}), REDUCE of a
// dataclass). Used by every format decoder.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/checkpoint_model.h"
#include "pickle/value.h"

namespace ckpt::pyobj {

// "module.Name" of the class that made `v` (kCall/kBuilt), or "" for plain values.
std::string class_name(const pickle::Value& v);
// True when the class name ends with "." + short_name (module paths move between torch versions).
bool is_class(const pickle::Value& v, std::string_view short_name);
// The object's state: BUILD's state, with __slots__ tuples (dict, slots) merged into one dict.
pickle::ValuePtr state_of(const pickle::Value& v);
// A field of the object's state dict; nullptr when absent.
pickle::ValuePtr field(const pickle::Value& v, std::string_view name);
// Like field, DataLoss naming the class and field when absent.
pickle::ValuePtr require_field(const pickle::Value& v, std::string_view name);

// A torch.Size / tuple / list of ints.
Shape int_sequence(const pickle::Value& v, const char* what);
// A torch dtype global (torch.float32) as DType; Unimplemented for unknown ones.
DType torch_dtype(const pickle::Value& v);

}  // namespace ckpt::pyobj
