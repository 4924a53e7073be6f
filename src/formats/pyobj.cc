#include "formats/pyobj.h"

#include "core/error.h"

namespace ckpt::pyobj {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {
const Value* callable_global(const Value& v) {
  const Value* obj = &v;
  while (obj->is(Kind::kBuilt) && obj->object) obj = obj->object.get();
  if (obj->is(Kind::kCall) && obj->callable && obj->callable->is(Kind::kGlobal)) {
    // copyreg.__newobj__ / __reduce_ex__ forms put the class first in args.
    if (obj->callable->is_global("copyreg", "__newobj__") && obj->args && !obj->args->items.empty() &&
        obj->args->items[0]->is(Kind::kGlobal))
      return obj->args->items[0].get();
    return obj->callable.get();
  }
  return nullptr;
}

void merge_into(const ValuePtr& from, std::vector<std::pair<ValuePtr, ValuePtr>>& into) {
  if (from && from->is(Kind::kDict)) into.insert(into.end(), from->entries.begin(), from->entries.end());
}
}  // namespace

std::string class_name(const Value& v) {
  const Value* g = callable_global(v);
  return g ? g->text + "." + g->name : std::string();
}

bool is_class(const Value& v, std::string_view short_name) {
  std::string name = class_name(v);
  if (name.size() <= short_name.size()) return false;
  return name.compare(name.size() - short_name.size(), short_name.size(), short_name) == 0 &&
         name[name.size() - short_name.size() - 1] == '.';
}

ValuePtr state_of(const Value& v) {
  if (!v.is(Kind::kBuilt) || !v.state) return nullptr;
  const ValuePtr& s = v.state;
  if (s->is(Kind::kTuple) && s->items.size() == 2) {
    auto merged = Value::dict();
    merge_into(s->items[0], merged->entries);
    merge_into(s->items[1], merged->entries);
    return merged;
  }
  // Several BUILDs on one object: the inner object's state first.
  if (v.object && v.object->is(Kind::kBuilt) && s->is(Kind::kDict)) {
    auto merged = Value::dict();
    merge_into(state_of(*v.object), merged->entries);
    merge_into(s, merged->entries);
    return merged;
  }
  return s;
}

ValuePtr field(const Value& v, std::string_view name) {
  ValuePtr s = state_of(v);
  if (!s || !s->is(Kind::kDict)) return nullptr;
  for (const auto& [k, val] : s->entries)
    if (k->is(Kind::kStr) && k->text == name) return val;
  return nullptr;
}

ValuePtr require_field(const Value& v, std::string_view name) {
  ValuePtr f = field(v, name);
  if (!f) fail_data_loss("object of class '" + class_name(v) + "' has no field '" + std::string(name) + "'");
  return f;
}

Shape int_sequence(const Value& v, const char* what) {
  const Value* seq = &v;
  if (v.is(Kind::kCall) && v.args && !v.args->items.empty()) seq = v.args->items[0].get();  // torch.Size((...))
  if (!seq->is(Kind::kTuple) && !seq->is(Kind::kList))
    fail_data_loss(std::string(what) + " is not a sequence of integers (" + v.repr(2) + ")");
  Shape out;
  out.reserve(seq->items.size());
  for (const auto& item : seq->items) out.push_back(item->as_int());
  return out;
}

DType torch_dtype(const Value& v) {
  if (!v.is(Kind::kGlobal) || v.text != "torch") fail_data_loss("expected a torch dtype, found " + v.repr(2));
  auto d = dtype_from_name(v.name);
  if (!d) fail(ErrorCode::kUnimplemented, "unsupported dtype torch." + v.name);
  return *d;
}

}  // namespace ckpt::pyobj
